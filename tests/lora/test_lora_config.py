"""Bad fine-tuning input: one line naming the task and the field; saved adapters intact."""

from __future__ import annotations

import json

import pytest
import torch

from legato.errors import CheckpointError, ConfigError, DataError, LegatoError
from legato.lora.config import finetune_config_from_dict, load_finetune_config
from legato.lora.runner import finetune, load_base
from legato.models import build_model, save_safetensors

SMALL_BASE = {
    "preset": "tiny",
    "overrides": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "ffn_hidden_size": 64,
                  "vocab_size": 258, "seq_len": 64},
}  # fmt: skip


def _config(tmp_path, *tasks, **sections):
    data = {
        "base": SMALL_BASE,
        "run": {"output_dir": str(tmp_path / "out"), "device": "cpu"},
        "schedule": {"max_tokens_per_step": 512, "profile": True},
        "task_defaults": {"steps": 2, "batch_size": 2, "seq_len": 32, "rank": 2},
        "tasks": list(tasks),
        **sections,
    }
    return finetune_config_from_dict(data, tmp_path)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "good.jsonl"
    lines = [{"prompt": f"{i}+{i}=", "response": str(2 * i)} for i in range(60)]
    path.write_text("\n".join(json.dumps(r) for r in lines), encoding="utf-8")
    return path.name


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"rank": 0}, ConfigError, "tasks.bad.rank: must be >= 1, got 0"),
        ({"rank": -3}, ConfigError, "tasks.bad.rank: must be >= 1, got -3"),
        ({"dropout": 1.0}, ConfigError, "tasks.bad.dropout: must be in [0, 1), got 1.0"),
        ({"rnak": 4}, ConfigError, "tasks.bad.rnak: unknown field; allowed fields are"),
        ({"rank": "big"}, ConfigError, "tasks.bad.rank: expected an integer, got 'big'"),
        ({"data": "missing.jsonl"}, DataError, "tasks.bad.data: file not found: "),
        (
            {"target_modules": ["q_proj", "qq_proj"]},
            ConfigError,
            "tasks.bad.target_modules: 'qq_proj' is not a linear layer of the base model; "
            "available: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj",
        ),
        (
            {"seq_len": 65},
            ConfigError,
            "tasks.bad.seq_len: must be <= the base model's seq_len 64, got 65",
        ),
    ],
)
def test_bad_task_is_one_line_naming_task_and_field_and_saved_adapters_survive(
    tmp_path, data_file, fields, error, message
):
    good = {"name": "good", "data": data_file}
    finetune(_config(tmp_path, good))
    saved = {p.name: p.read_bytes() for p in (tmp_path / "out" / "good").iterdir()}
    bad = {"name": "bad", "data": data_file, **fields}
    with pytest.raises(error) as caught:
        finetune(_config(tmp_path, {"name": "other", "data": data_file}, bad, good))
    text = str(caught.value)
    assert text.startswith(message.split("*")[0]) and "\n" not in text
    after = {p.name: p.read_bytes() for p in (tmp_path / "out" / "good").iterdir()}
    assert after == saved
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good", "metrics.jsonl"]


def test_config_level_mistakes(tmp_path, data_file):
    with pytest.raises(ConfigError, match="tasks: give at least one"):
        _config(tmp_path)
    with pytest.raises(ConfigError, match=r"tasks\.a\.name: 'a' is used by two tasks"):
        _config(tmp_path, {"name": "a", "data": data_file}, {"name": "a", "data": data_file})
    with pytest.raises(ConfigError, match=r"tasks\[0\].name: required field is missing"):
        _config(tmp_path, {"data": data_file})
    with pytest.raises(ConfigError, match=r"tasks\.a/b\.name: must be letters"):
        _config(tmp_path, {"name": "a/b", "data": data_file})
    with pytest.raises(LegatoError, match="base: unknown model 'nope'"):
        _config(tmp_path, {"name": "a", "data": data_file}, base={"preset": "nope"}).base.spec()
    router = {"name": "a", "data": data_file, "target_modules": ["gate"]}  # inside MoE layers
    with pytest.raises(ConfigError, match=r"tasks\.a\.target_modules: 'gate' is not a linear"):
        finetune(_config(tmp_path, router, base={"preset": "tiny-moe"}))


def test_overrides_and_relative_data_paths(tmp_path, data_file):
    path = tmp_path / "ft.toml"
    path.write_text(
        '[task_defaults]\nrank = 4\n\n[[tasks]]\nname = "a"\ndata = "good.jsonl"\n',
        encoding="utf-8",
    )
    config = load_finetune_config(path, ["--task_defaults.rank=6", "--run.device=cpu"])
    assert config.tasks[0].rank == 6 and config.run.device == "cpu"
    assert config.tasks[0].data == str(tmp_path / data_file)
    with pytest.raises(ConfigError, match="tasks: cannot be overridden"):
        load_finetune_config(path, ["--tasks.rank=3"])


def test_base_weights_load_from_hf_safetensors_and_stay_frozen(tmp_path, data_file):
    config = _config(tmp_path, {"name": "a", "data": data_file})
    source = build_model(config.base.spec(), seed=123)
    save_safetensors(source, tmp_path / "base")
    config.base.weights = str(tmp_path / "base")
    model = load_base(config, torch.device("cpu"))[0]
    for (name, ours), theirs in zip(
        model.base.state_dict().items(), source.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    assert not any(p.requires_grad for p in model.base.parameters())
    config.base.weights = str(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=r"^base\.weights: checkpoint .* does not exist"):
        load_base(config, torch.device("cpu"))[0]
