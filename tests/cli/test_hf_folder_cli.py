"""A Hugging Face folder wherever a model is: ``model.preset``/``model.init`` for train,
``--model`` for predict and serve, ``base.weights`` for finetune."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chat_folders import qwen_folder
from hf_folders import save_hf_folder
from legato.cli.main import main
from legato.data import PackedDataset
from legato.errors import ConfigError, DataError
from legato.lora.config import finetune_config_from_dict
from legato.lora.runner import load_base
from legato.serve.loading import load_served_model, random_weights
from legato.train.config import ModelSection, load_config, resolve_model
from legato.train.evaluate import trained_eval_set
from legato.train.run_data import resolve_tokenizer, split_holdout, token_stream
from legato.train.trained_model import load_trained


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_first_step_loss_is_transformers_loss(family, small_train_args, tmp_path, capsys):
    hf, folder = save_hf_folder(family, tmp_path / family)
    run = tmp_path / "run"
    args = small_train_args(
        run,
        f"--model.preset={folder}",
        f"--model.init={folder}",
        "--model.overrides={seq_len = 32}",
        "--train.steps=1",
        "--parallel.nproc=1",
        "--train.moe_aux_loss_coef=0",
    )
    assert main(["train", *args]) == 0, capsys.readouterr().err
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    # the run's first batch, drawn as the trainer draws it
    config = load_config(None, args)
    tokens = token_stream(config.data, resolve_tokenizer(config.data))
    data = PackedDataset(split_holdout(tokens, 0.0)[0], 32, seed=config.train.seed)
    inputs, labels = data.next_batch(config.train.global_batch_size)
    with torch.no_grad():
        logits = hf(inputs).logits
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    assert first["loss"] == pytest.approx(expected, rel=1e-5)


def test_default_preset_takes_the_init_spec_and_a_mismatch_is_one_line(tmp_path):
    _, folder = save_hf_folder("qwen3", tmp_path / "q3")
    spec = resolve_model(ModelSection(init=str(folder), overrides={"seq_len": 16}))
    assert spec.qk_norm and spec.seq_len == 16 and spec.name == "q3"
    with pytest.raises(ConfigError, match=r"model.init: .* \(num_layers: it has 2, config has 3\)"):
        resolve_model(ModelSection(init=str(folder), overrides={"num_layers": 3}))
    with pytest.raises(ConfigError, match=r"model\.init: .*hidden_size"):
        resolve_model(ModelSection(preset="llama3-8b", init=str(folder)))


def test_predict_takes_a_folder(tmp_path, capsys):
    _, folder = save_hf_folder("mixtral", tmp_path / "mx")
    argv = ["predict", "--model", str(folder), "--cluster", "dgx-a100", "--strategy", "dp=8,gbs=8"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 8


def test_serve_and_finetune_load_the_folder(tmp_path):
    hf, folder = save_hf_folder("qwen3_moe", tmp_path / "q")
    ids = torch.randint(0, 258, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits
    with pytest.raises(DataError, match=r"--tokenizer: .* has no tokenizer\.json"):
        load_served_model(str(folder))
    model, _, name = load_served_model(str(folder), tokenizer="byte")
    assert name == "q" and not random_weights(str(folder))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, atol=1e-5, rtol=1e-5)
    config = finetune_config_from_dict(
        {
            "base": {"weights": str(folder)},
            "run": {"device": "cpu", "output_dir": str(tmp_path / "out"), "tokenizer": "byte"},
            "tasks": [{"name": "t", "data": str(_task(tmp_path)), "steps": 1}],
        }
    )
    backbone, _ = load_base(config, torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(backbone.base(ids), expected, atol=1e-5, rtol=1e-5)


def _task(tmp_path: Path) -> Path:
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "response": "2"}) + "\n")
    return path


def test_eval_takes_a_folder_and_scores_it_as_transformers_does(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # its tokens are cached in ~/.cache/legato
    hf, folder = save_hf_folder("qwen2", qwen_folder(tmp_path / "q2"), vocab_size=512)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    assert main(["eval", str(folder), "--data", str(text), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    dataset = trained_eval_set(load_trained(folder), [str(text)])
    inputs, labels = dataset.windows(np.arange(dataset.num_sequences))
    with torch.no_grad():
        logits = hf(inputs).logits
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    assert report["step"] == 0 and report["sequences"] == dataset.num_sequences
    assert report["loss"] == pytest.approx(expected, rel=1e-5)
    assert main(["eval", str(folder)]) == 2
    assert "has no held-out split (data.holdout = 0); pass --data PATH" in capsys.readouterr().err
