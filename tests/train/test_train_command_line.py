"""What users type on the command line and in TOML files is read the way they mean it:
``--key value`` as well as ``--key=value``, one data file as a string, and every bad
file or out-of-range number as one line naming the file or the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.cli.main import main
from legato.errors import ConfigError
from legato.lora.config import load_finetune_config
from legato.train.config import TRAIN_FLAGS, load_config, split_command_line


@pytest.mark.parametrize(
    "tokens",
    [
        ["cfg.toml", "--train.steps", "7", "--optim.lr=0.5"],
        ["--train.steps", "7", "cfg.toml", "--optim.lr", "0.5"],
        ["--train.steps=7", "--optim.lr", "0.5", "cfg.toml"],
    ],
)
def test_space_and_equals_forms_give_the_same_config(tmp_path: Path, tokens: list[str]) -> None:
    (tmp_path / "cfg.toml").write_text("[train]\nsteps = 3\nlog_every = 2\n")
    tokens = [str(tmp_path / t) if t == "cfg.toml" else t for t in tokens]
    config_path, overrides = split_command_line(tokens)
    assert config_path == str(tmp_path / "cfg.toml")
    assert overrides == ["--train.steps=7", "--optim.lr=0.5"]
    config = load_config(config_path, overrides)
    assert (config.train.steps, config.optim.lr, config.train.log_every) == (7, 0.5, 2)


def test_a_bool_field_may_stand_alone() -> None:
    """``--run.fresh`` is ``--run.fresh=true``, and leaves the next token to be the config
    file; other fields, and other commands' lines, still need a value."""
    tokens = ["--run.fresh", "cfg.toml", "--train.fp8-all-gather", "false", "--run.fresh"]
    assert split_command_line(tokens, TRAIN_FLAGS) == (
        "cfg.toml",
        ["--run.fresh=true", "--train.fp8-all-gather=false", "--run.fresh=true"],
    )
    with pytest.raises(ConfigError, match="this one has no value"):
        split_command_line(["--run.fresh"])
    with pytest.raises(ConfigError, match="this one has no value"):
        split_command_line(["--train.steps"], TRAIN_FLAGS)


def test_space_form_keeps_values_with_spaces_and_negative_numbers() -> None:
    config = load_config(None, ["--model.overrides", "{num_layers = 1}", "--train.seed", "5"])
    assert config.model.overrides == {"num_layers": 1} and config.train.seed == 5
    with pytest.raises(ConfigError, match=r"^optim\.lr: must be > 0, got -1\.0$"):
        load_config(None, ["--optim.lr", "-1"])


def test_one_data_path_may_be_a_string(tmp_path: Path) -> None:
    (tmp_path / "cfg.toml").write_text('[data]\npaths = "corpus.txt"\n')
    assert load_config(tmp_path / "cfg.toml").data.paths == ["corpus.txt"]
    assert load_config(None, ["--data.paths", "a.txt"]).data.paths == ["a.txt"]
    assert load_config(None, ['--data.paths=["a.txt", "b.txt"]']).data.paths == ["a.txt", "b.txt"]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("legato: error:") and "\n" not in err
    return err


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_directory_and_non_utf8_config_are_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _one_line_error([command, str(tmp_path)], capsys)
    assert f"{tmp_path}: is a directory; expected a TOML file" in err
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[run]\nname = "caf\u00e9"\n'.encode("latin-1"))
    err = _one_line_error([command, str(latin1)], capsys)
    assert f"{latin1}: not UTF-8 (byte 17); TOML files must be UTF-8 text" in err


def test_non_utf8_model_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.json"
    model.write_bytes(b'{"name": "\xff"}')
    err = _one_line_error(["train", f"--model.preset={model}"], capsys)
    assert f"{model}: not UTF-8 (byte 10); JSON files must be UTF-8 text" in err


def test_finetune_accepts_space_form_overrides(tmp_path: Path) -> None:
    config = tmp_path / "ft.toml"
    config.write_text('[[tasks]]\nname = "a"\ndata = "a.jsonl"\n')
    loaded = load_finetune_config(config, ["--run.log_every", "3", "--schedule.profile", "false"])
    assert loaded.run.log_every == 3 and loaded.schedule.profile is False
    with pytest.raises(ConfigError, match=r"^tasks\.a\.rank: must be between 1 and 2\*\*24"):
        load_finetune_config(config, [f"--task_defaults.rank={2**30}"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"--train.global_batch_size={2**24 + 1}"], "train.global_batch_size: must be between 1 and 2**24 = 16777216, got 16777217"),
        (["--parallel.nproc=2000000"], "parallel.nproc: must be between 1 and 2**20 = 1048576"),
        (["--parallel.strategy=dp=2,gbs=99999999999999999999"], "strategy.gbs: must be between 1 and 2**24"),
        (["--parallel.strategy=pp=2000000"], "strategy.pp: must be between 1 and 2**20"),
        (["--data.seq_len=100000000"], "data.seq_len: must be between 0 and 2**24"),
        (["--model.overrides.hidden_size=100000000"], "hidden_size: must be between 1 and 2**24"),
    ],
)  # fmt: skip
def test_absurd_sizes_are_refused_with_their_range(
    overrides: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _one_line_error(["train", *overrides], capsys)


def test_plan_refuses_absurd_batch(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gbs", "99999999999999999999"]
    assert "gbs: must be between 1 and 2**24" in _one_line_error(argv, capsys)
