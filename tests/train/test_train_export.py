"""`legato export` and fine-tuning on a trained run: what transformers loads from the folder
computes the legato model's logits and encodes like the run's tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from legato.cli.main import main
from legato.data import BpeTokenizer, ByteTokenizer
from legato.errors import CheckpointError, ConfigError
from legato.lora.config import finetune_config_from_dict
from legato.lora.runner import finetune, load_base
from legato.models import build_model
from legato.specs.registry import load_model
from legato.train.config import load_config
from legato.train.export import export_hf
from legato.train.run_data import resolve_tokenizer, run_tokenizer
from legato.train.trained_model import load_trained
from legato.train.trainer import Trainer

transformers = pytest.importorskip("transformers")

TEXT = "Once upon a time, a wörld of 🎉 tabs\tand  spaces.\n\nThe end"


@pytest.fixture(scope="module")
def bpe_run(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 steps of a BPE-tokenised run, checkpointed at the end (a GQA, untied model)."""
    run = tmp_path_factory.mktemp("bpe") / "run"
    args = small_train_args(
        run,
        "--parallel.nproc=1",
        "--train.steps=3",
        "--checkpoint.every=3",
        "--data.tokenizer=bpe",
        "--data.bpe_vocab_size=300",
        "--model.overrides.vocab_size=320",  # padded beyond the tokenizer's ids
        "--model.overrides.rope_theta=5000.0",
        "--model.overrides.norm_eps=1e-6",
    )
    Trainer(load_config(None, args)).fit()
    return run


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    return getattr(out, "logits", out)


def test_exported_run_loads_in_transformers(bpe_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "hf"
    assert main(["export", str(bpe_run), "--format", "hf", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    trained = load_trained(bpe_run)
    assert trained.step == 3 and trained.tokenizer.name.startswith("bpe-")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 5000.0 and config["rms_norm_eps"] == 1e-6
    assert config["num_key_value_heads"] == 1 and config["vocab_size"] == 320

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = trained.tokenizer.encode(TEXT)
    assert hf_tok(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert hf_tok.eos_token_id == trained.tokenizer.eos_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(_logits(hf, ids), _logits(trained.model, ids), atol=1e-5, rtol=1e-5)
    # the weights are the trained ones, not a fresh initialisation
    fresh = build_model(trained.spec, seed=0)
    assert not torch.allclose(_logits(fresh, ids), _logits(trained.model, ids), atol=1e-3)


def test_run_dir_keeps_the_trained_tokenizer(bpe_run: Path) -> None:
    data = load_config(bpe_run / "config.toml").data
    cached = resolve_tokenizer(data)  # the cache's copy, trained at the start of the run
    saved = BpeTokenizer.load(bpe_run / "tokenizer.json")
    assert saved.name == cached.name and saved.vocab_size == cached.vocab_size
    assert saved.encode(TEXT) == cached.encode(TEXT)
    data.cache_dir = str(bpe_run / "no-cache")  # the run dir alone is enough
    assert run_tokenizer(bpe_run, data).name == saved.name
    assert not (bpe_run / "no-cache").exists()


def test_export_of_a_step_dir_replaces_out_atomically(bpe_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    step = bpe_run / "checkpoints" / "step_000003"
    assert main(["export", str(step), str(out)]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert json.loads((out / "legato_export.json").read_text())["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temp folder left


def test_export_of_a_non_run_is_one_line(tmp_path: Path, capsys) -> None:
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "neither a legato run directory" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("preset", "overrides", "architecture"),
    [
        ("tiny", {"qk_norm": True, "tied_embeddings": True}, "Qwen3ForCausalLM"),
        ("tiny-moe", {}, "MixtralForCausalLM"),
        ("tiny-moe", {"qk_norm": True, "moe": {"first_dense_layers": 1}}, "Qwen3MoeForCausalLM"),
    ],
)
def test_architectures_compute_the_same_logits(preset, overrides, architecture, tmp_path) -> None:
    spec = load_model(preset)
    spec = spec.with_(num_layers=2, **{k: v for k, v in overrides.items() if k != "moe"})
    if "moe" in overrides:
        spec = spec.with_(moe=dataclasses.replace(spec.moe, **overrides["moe"]))
    model = build_model(spec, seed=1).eval()
    with torch.no_grad():  # give the qk-norm gains and router something to do
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    export_hf(model, ByteTokenizer(), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == architecture
    ids = ByteTokenizer().encode(TEXT)
    torch.testing.assert_close(_logits(hf, ids), _logits(model, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("preset", "what"), [("tiny-gpt", "mlp = 'gelu'"), ("tiny-deepseek", "mla")]
)
def test_unsupported_architectures_are_refused(preset, what, tmp_path) -> None:
    model = build_model(load_model(preset).with_(num_layers=1), seed=0)
    with pytest.raises(ConfigError, match=rf"no Hugging Face architecture computes it \({what}\)"):
        export_hf(model, ByteTokenizer(), tmp_path / "hf")
    assert not any(tmp_path.iterdir())


def _finetune_config(tmp_path: Path, base: dict, run: dict | None = None):
    data = tmp_path / "task.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(40))
    )
    return finetune_config_from_dict(
        {
            "base": base,
            "run": {"device": "cpu", "output_dir": str(tmp_path / "out"), **(run or {})},
            "schedule": {"profile": False, "max_tokens_per_step": 256},
            "tasks": [
                {"name": "add", "data": str(data), "steps": 2, "batch_size": 2, "seq_len": 32}
            ],
        }
    )


def test_finetune_on_a_trained_run(bpe_run: Path, tmp_path: Path) -> None:
    config = _finetune_config(tmp_path, {"weights": str(bpe_run)})
    backbone = load_base(config, torch.device("cpu"))[0]
    trained = load_trained(bpe_run)
    for (name, ours), theirs in zip(
        backbone.base.state_dict().items(), trained.model.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    saved = finetune(config)
    assert (saved["add"] / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("base", "run", "message"),
    [
        ({"weights": "{empty}"}, {}, "base.weights: .* is neither a legato run directory"),
        ({"weights": "{run}", "preset": "tiny"}, {}, "base.preset: must be left empty"),
        ({"weights": "{run}"}, {"tokenizer": "byte"}, "run.tokenizer: must be left empty"),
    ],
)
def test_finetune_base_errors_are_one_line(bpe_run, tmp_path, base, run, message) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"{empty}": str(tmp_path / "empty"), "{run}": str(bpe_run)}
    base = {k: paths.get(v, v) for k, v in base.items()}
    with pytest.raises((CheckpointError, ConfigError), match=message):
        load_base(_finetune_config(tmp_path, base, run), torch.device("cpu"))[0]
