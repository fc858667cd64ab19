"""TrainConfig: TOML + overrides, documented defaults, and one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from legato.cli.main import main
from legato.errors import ConfigError
from legato.specs.strategy import StrategyError
from legato.train.config import (
    TrainConfig,
    load_config,
    make_run_dir,
    parse_overrides,
    render_toml,
    resolve_model,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _all_fields(config: TrainConfig) -> list[str]:
    return [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(config)
        for f in dataclasses.fields(getattr(config, section.name))
    ]


def test_defaults_without_a_file() -> None:
    config = load_config()
    assert config == TrainConfig()
    assert config.model.preset == "tiny" and config.parallel.nproc == 2
    spec = resolve_model(config.model)
    assert config.job(spec, 2).microbatches == 1 and config.job(spec, 1).microbatches == 2


def test_every_field_is_documented() -> None:
    for section in dataclasses.fields(TrainConfig):
        for f in dataclasses.fields(section.default_factory()):
            assert f.metadata.get("doc"), f"{section.name}.{f.name} has no documentation"


def test_examples_tiny_is_the_default_spelled_out() -> None:
    text = (EXAMPLES / "tiny.toml").read_text()
    assert load_config(EXAMPLES / "tiny.toml") == TrainConfig()
    table = tomllib.loads(text)
    for name in _all_fields(TrainConfig()):
        section, key = name.split(".")
        assert key in table[section], f"examples/tiny.toml lacks {name}"


def test_examples_tiny_moe_is_a_moe_model() -> None:
    config = load_config(EXAMPLES / "tiny_moe.toml")
    assert resolve_model(config.model).is_moe


def test_render_toml_round_trips_a_changed_config(tmp_path: Path) -> None:
    config = load_config(None, ["--train.steps=7", "--data.paths=['a.txt', 'b.jsonl']"])
    config.model.overrides = {"num_layers": 2, "moe": {"top_k": 1}}
    path = tmp_path / "config.toml"
    path.write_text(render_toml(config, "a header"))
    assert load_config(path) == config


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[train]\nsteps = 50\ndtype = "bf16"\n[optim]\nlr = 1e-3\n')
    config = load_config(
        path,
        [
            "--train.steps=60",
            "--optim.weight-decay=0",
            "--train.dtype=fp32",
            "--parallel.strategy=zero=0",
            "--data.paths=['x.txt']",
            "--model.overrides.num_layers=2",
            "--run.name=my run",
        ],
    )
    assert config.train.steps == 60 and config.optim.lr == 1e-3
    assert config.optim.weight_decay == 0.0 and config.train.dtype == "fp32"
    assert config.parallel.strategy == "zero=0" and config.data.paths == ["x.txt"]
    assert config.model.overrides == {"num_layers": 2} and config.run.name == "my run"


def test_parse_overrides_values() -> None:
    tree = parse_overrides(
        ["--a.i=3", "--a.f=2.5e-4", "--a.s=bf16", "--a.q='3'", "--a.t.x={y = 1}"]
    )
    assert tree == {"a": {"i": 3, "f": 2.5e-4, "s": "bf16", "q": "3", "t": {"x": {"y": 1}}}}


def test_model_overrides_apply_to_the_preset() -> None:
    config = load_config(None, ["--model.overrides={num_layers = 2, hidden_size = 64}"])
    spec = resolve_model(config.model)
    assert (spec.num_layers, spec.hidden_size, spec.name) == (2, 64, "tiny")


def test_make_run_dir_never_reuses_a_timestamp(tmp_path: Path) -> None:
    run = TrainConfig().run
    first, second = make_run_dir(run, tmp_path), make_run_dir(run, tmp_path)
    assert first != second and first.is_dir() and second.is_dir()
    named = dataclasses.replace(run, name="exp1")
    assert make_run_dir(named, tmp_path) == tmp_path / "exp1"


BAD = [
    (["--train.stepz=3"], "train.stepz: unknown field"),
    (["--trian.steps=3"], "trian: unknown field"),
    (["--train.steps=abc"], "train.steps: expected an integer"),
    (["--train.steps=0"], "train.steps: must be >= 1"),
    (["--optim.lr=-1"], "optim.lr: must be > 0"),
    (["--optim.beta2=1.0"], "optim.beta2: must be in [0, 1)"),
    (["--train.dtype=fp4"], "train.dtype: must be one of 'fp32' | 'bf16' | 'fp16'"),
    (["--parallel.backend=mpi"], "parallel.backend: must be one of"),
    (["--parallel.fsdp=yes"], "parallel.fsdp: no longer a config field"),
    (["--data.paths=3"], "data.paths: expected list of str | str, got 3"),
    (["--checkpoint.keep=0"], "checkpoint.keep: must be >= 1"),
    (["--train.steps"], "--train.steps: overrides are written --section.key=value"),
    (["steps=3"], "steps=3: overrides are written"),
    (["--model.overrides.num_layer=2"], "model.overrides.num_layer: unknown field"),
    (["--model.overrides.num_kv_heads=3"], "model.overrides: num_kv_heads must divide"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[a[0] for a, _ in BAD])
def test_bad_input_is_one_config_error(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_model(load_config(None, args).model)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_batch_sizes_must_divide() -> None:
    config = load_config(None, ["--train.global_batch_size=12", "--train.micro_batch_size=4"])
    spec = resolve_model(config.model)
    assert config.job(spec, 1).microbatches == 3
    with pytest.raises(
        StrategyError, match=r"gbs \(12\) must be a multiple of mbs\*dp \(4\*2 = 8\)"
    ):
        config.job(spec, 2)


def test_bad_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[train\nsteps = 3\n")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train.stepz=3"], "train.stepz: unknown field"),
        (["--train.global_batch_size=10", "--train.micro_batch_size=4"], "multiple of"),
        (["--parallel.nproc=3", "--train.global_batch_size=16"], "= 18"),
        (["MISSING.toml"], "MISSING.toml: file not found"),
        (
            ["--train.steps", "5", "--train.stepz"],
            "--train.stepz: overrides are written --section.key=value or --section.key value; this one has no value",
        ),
        (["a.toml", "--train.steps", "5", "b.toml"], "b.toml: one config file at most"),
        (["--train.steps", "99999999999999999999"], "train.steps: must fit in 64 bits"),
        (["--train.steps", str(2**41)], "train.steps: must be between 1 and 2**40"),
        (["--model.preset=nosuchmodel"], "unknown model 'nosuchmodel'"),
    ],
)
def test_cli_reports_config_errors_as_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("legato: error:") and message in err and "\n" not in err


def test_cli_vocab_smaller_than_tokenizer(
    small_train_args, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = small_train_args(run_dir, "--parallel.nproc=1", "--model.overrides.vocab_size=200")
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.overrides.vocab_size" in err and "(258" in err and "\n" not in err


def test_help_config_lists_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    table = tomllib.loads(out)
    for name in _all_fields(TrainConfig()):
        section, key = name.split(".")
        assert key in table[section]


def test_cli_failed_run_leaves_no_run_directory(
    tmp_path: Path, data_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "short.txt").write_text("far too short to fill one sequence\n")
    runs = tmp_path / "runs"
    args = [
        f"--data.paths=['{tmp_path / 'short.txt'}']",
        f"--data.cache_dir={data_cache}",
        f"--run.dir={runs / 'failed'}",
        "--parallel.nproc=1",
    ]
    assert main(["train", *args]) == 2
    assert "fewer than one sequence" in capsys.readouterr().err
    assert not (runs / "failed").exists()


SPLIT = ["--train.global_batch_size=8", "--train.micro_batch_size=2"]
BAD_SPLITS = [
    ("[4, 2, 2]", "", "train.batch_split: must have one entry per data-parallel rank (2)"),
    ("[5, 2]", "", "train.batch_split: must sum to train.global_batch_size (8), got [5, 2]"),
    ("[8, 0]", "", "train.batch_split: every entry must be >= 1, got [8, 0]"),
    ("[7, 1]", "", "train.batch_split: every entry must be >= the micro-batches per step"),
    ("[5, 3.5]", "", "train.batch_split[1]: expected an integer"),
    ("[4, 4]", "pp=2,dp=1", "train.batch_split: must be [] with pp > 1"),
]


@pytest.mark.parametrize(("split", "strategy", "message"), BAD_SPLITS)
def test_bad_batch_split_is_one_config_error(split: str, strategy: str, message: str) -> None:
    args = [*SPLIT, f"--train.batch_split={split}", f"--parallel.strategy={strategy}"]
    with pytest.raises(ConfigError) as info:
        config = load_config(None, args)
        config.job(resolve_model(config.model), 2)  # the dp size is known here
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_batch_split_from_toml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[train]\nglobal_batch_size = 8\nmicro_batch_size = 2\nbatch_split = [5, 3]\n")
    assert load_config(path).train.batch_split == [5, 3]
    config = load_config(path, ["--train.batch_split=[3,5]"])
    assert config.train.batch_split == [3, 5]
    assert config.job(resolve_model(config.model), 2).strategy.dp == 2
    # a pasted strategy's gbs and mbs are the ones the split is checked against
    pasted = load_config(None, ["--parallel.strategy=mbs=2,gbs=10", "--train.batch_split=[6,4]"])
    assert pasted.train.global_batch_size == 10
