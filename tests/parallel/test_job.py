"""``parallel.strategy`` resolved into a Job: parsing, what the runtime accepts, dp, zero
and micro-batches derived, the schedule built, strategy keys setting the train fields, and
one-line errors (from the config and from the command line)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from legato.cli.main import main
from legato.errors import ConfigError
from legato.parallel.job import pipeline_schedule
from legato.specs.model import ModelSpec, MoESpec
from legato.specs.strategy import StrategyError
from legato.train.config import load_config, resolve_model

SPEC = ModelSpec(
    name="t", hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=2, vocab_size=64, seq_len=32
)


def _resolve(strategy: str, world: int, *extra: str):
    config = load_config(None, [f"--parallel.strategy={strategy}", *extra])
    return config.job(SPEC, world).strategy


def test_default_is_data_parallel_over_every_process() -> None:
    s = _resolve("", 4, "--train.global_batch_size=16", "--train.micro_batch_size=2")
    assert (s.pp, s.dp, s.num_microbatches, s.zero) == (1, 4, 2, 3)
    assert _resolve("", 1).dp == 1


def test_planner_strings_are_pasted_unchanged_and_set_the_train_fields() -> None:
    text = "dp=1,tp=1,pp=2,mbs=2,gbs=8,dtype=bf16,zero=0"
    config = load_config(None, [f"--parallel.strategy={text}", "--train.micro_batch_size=3"])
    train = config.train
    assert (train.micro_batch_size, train.global_batch_size, train.dtype) == (2, 8, "bf16")
    s = config.job(SPEC, 2).strategy
    assert (s.pp, s.dp, s.num_microbatches, s.zero, s.dtype) == (2, 1, 4, 0, "bf16")
    # to_string leaves out defaults (dtype bf16): the train section's dtype then applies
    assert _resolve(s.to_string(), 2, "--train.dtype=bf16") == s


def test_zero_is_the_strategys_and_defaults_to_fsdp2_for_data_parallelism() -> None:
    assert [_resolve(f"zero={z}", 2).zero for z in (0, 2, 3)] == [0, 2, 3]
    assert _resolve("", 2).zero == 3 and _resolve("", 1).zero == 0
    assert (
        _resolve("pp=2", 2, "--train.global_batch_size=8", "--train.micro_batch_size=2").zero == 0
    )


@pytest.mark.parametrize(
    ("field", "instead"),
    [("fsdp=false", "zero=0 DDP"), ("reshard_after_forward=false", "zero=2 keeps parameters")],
)
def test_replaced_parallel_fields_say_where_they_went(field: str, instead: str) -> None:
    with pytest.raises(ConfigError, match=instead) as info:
        load_config(None, [f"--parallel.{field}"])
    assert str(info.value).startswith(f"parallel.{field.split('=')[0]}: no longer a config field")


def test_dp_is_derived_and_micro_batches_follow() -> None:
    # m = global / (micro x dp) = 16 / (2 x 2)
    s = _resolve("pp=2", 4, "--train.global_batch_size=16", "--train.micro_batch_size=2")
    assert (s.pp, s.dp, s.gbs, s.mbs, s.num_microbatches) == (2, 2, 16, 2, 4)
    given = _resolve("pp=2,dp=1", 2, "--train.global_batch_size=4", "--train.micro_batch_size=2")
    assert (given.dp, given.num_microbatches) == (1, 2)


@pytest.mark.parametrize(
    ("text", "name", "chunks", "slices"),
    [
        ("pp=2", "1f1b", 1, 1),
        ("pp=2,schedule=interleaved,vpp=2", "interleaved", 2, 1),
        ("pp=2,schedule=zb-v", "zb-v", 2, 1),  # the V shape: always 2 chunks
        ("pp=2,schedule=svpp,vpp=2,slices=4,memory_cap=12", "svpp", 2, 4),
        ("pp=2,schedule=seq1f1b,slices=2", "seq1f1b", 1, 2),
    ],
)
def test_schedule_follows_the_strategy(text: str, name: str, chunks: int, slices: int) -> None:
    s = _resolve(text, 2, "--train.global_batch_size=8", "--train.micro_batch_size=2")
    schedule = pipeline_schedule(s)
    assert (schedule.name, schedule.stages, schedule.microbatches) == (name, 2, 4)
    assert (schedule.placement.chunks, schedule.slices, s.vpp) == (chunks, slices, chunks)


CONFIG_ERRORS = [
    ("schedule=svpp", "parallel.strategy: schedule need pp > 1"),
    ("pp=x", "parallel.strategy: strategy.pp must be an integer"),
    ("pp=2,schedule=fast", "parallel.strategy: strategy.schedule must be one of"),
    ("pipeline=2", "parallel.strategy: strategy: bad item 'pipeline=2'"),
]


@pytest.mark.parametrize(("text", "message"), CONFIG_ERRORS, ids=[t for t, _ in CONFIG_ERRORS])
def test_unsupported_strategy_is_one_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"--parallel.strategy={text}"])
    assert message in str(info.value) and "\n" not in str(info.value)


RESOLVE_ERRORS = [
    ("pp=3", 2, StrategyError, "pp*dp*cp*tp = 3*1*1*1 = 3 must equal the device count 2"),
    ("pp=2,dp=2", 2, StrategyError, "must equal the device count 2"),
    ("pp=4,schedule=interleaved,vpp=2", 4, StrategyError, "pp*vpp (8) must be at most num_layers"),
    ("pp=2,schedule=zb-v,vpp=4", 2, ConfigError, "zb-v has exactly 2 chunks per rank"),
    ("pp=2,vpp=2", 2, StrategyError, "vpp=2 needs schedule interleaved, zb-v or svpp"),
    ("pp=2,mbs=3", 2, StrategyError, "gbs (8) must be a multiple of mbs*dp (3*1 = 3)"),
    ("pp=2,schedule=zb-h1,recompute=full", 2, StrategyError, "recompute=full with zb-h1"),
    (
        "pp=2,cp=4,schedule=seq1f1b,slices=8",
        8,
        StrategyError,
        "cuts every slice into 2*cp = 8 chunks, got slices of [4, 4, 4, 4, 4, 4, 4, 4] tokens",
    ),
    ("tp=2x2,dtype=fp8", 4, StrategyError, "tp=4 is not executed for dtype=fp8 with 2-D tp"),
]


@pytest.mark.parametrize(("text", "world", "kind", "message"), RESOLVE_ERRORS)
def test_strategy_that_does_not_fit_is_one_line(text, world, kind, message) -> None:
    with pytest.raises(kind) as info:
        _resolve(text, world, "--train.global_batch_size=8", "--train.micro_batch_size=2")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(f"parallel.strategy = {text!r}") or kind is ConfigError


def test_sequence_parallel_needs_tp_to_divide_every_slice() -> None:
    batch = ["--train.global_batch_size=8", "--train.micro_batch_size=2", "--data.seq_len=30"]
    whole = load_config(None, ["--parallel.strategy=pp=2,tp=2,sp=1", *batch])
    assert whole.job(SPEC, 4).strategy.sp
    sliced = "--parallel.strategy=pp=2,tp=2,sp=1,schedule=seq1f1b,slices=2"
    with pytest.raises(StrategyError, match=r"sp needs tp=2 to divide .* got \[15, 15\]"):
        load_config(None, [sliced, *batch]).job(SPEC, 4)


def test_expert_parallel_pipeline_defaults_to_fsdp2_in_the_stages() -> None:
    moe = replace(SPEC, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=16))
    batch = [
        "--train.global_batch_size=8", "--train.micro_batch_size=2",
        "--train.moe_aux_loss_coef=0",
    ]  # fmt: skip
    config = load_config(None, ["--parallel.strategy=pp=2,ep=2", *batch])
    assert config.job(moe, 4).strategy.zero == 1
    flat = load_config(None, ["--parallel.strategy=pp=2,ep=2,zero=0", *batch])
    assert flat.job(moe, 4).strategy.zero == 0  # averaged by the step, experts left to EP


@pytest.mark.parametrize(
    ("text", "world", "overrides", "message"),
    [
        ("tp=4,etp=2", 4, {}, "etp=2 must equal tp=4"),
        ("tp=2,etp=2", 2, {"bias": True}, "etp=2 runs experts without biases"),
        ("tp=2,etp=2", 2, {"expert_ffn_hidden_size": 15}, "must divide the experts' FFN width"),
    ],
)
def test_expert_tensor_parallelism_refuses_what_it_cannot_split(
    text: str, world: int, overrides: dict, message: str
) -> None:
    moe = replace(SPEC, num_heads=4, num_kv_heads=4, moe=MoESpec(
        num_experts=4, top_k=2, expert_ffn_hidden_size=overrides.pop("expert_ffn_hidden_size", 16)
    ), **overrides)  # fmt: skip
    config = load_config(None, [f"--parallel.strategy={text}", "--train.global_batch_size=8",
                                "--train.micro_batch_size=2"])  # fmt: skip
    with pytest.raises(StrategyError, match=message):
        config.job(moe, world)


def test_zero_in_a_pipeline_refuses_two_copies_of_a_tied_embedding_on_one_rank() -> None:
    tied = replace(SPEC, tied_embeddings=True)
    batch = ["--train.global_batch_size=8", "--train.micro_batch_size=2"]
    v_schedule = load_config(None, ["--parallel.strategy=pp=2,dp=2,zero=1,schedule=zb-v", *batch])
    with pytest.raises(StrategyError, match="zero=1 with tied_embeddings under zb-v"):
        v_schedule.job(tied, 4)
    assert v_schedule.job(SPEC, 4).strategy.zero == 1  # untied: two stages, two FSDP2 roots
    interleaved = "--parallel.strategy=pp=2,dp=2,zero=2,schedule=interleaved,vpp=2"
    assert load_config(None, [interleaved, *batch]).job(tied, 4).strategy.zero == 2


def test_two_dimensional_tensor_parallel_refuses_block_math_its_layout_lacks() -> None:
    config = load_config(None, ["--parallel.strategy=tp=2x2,sp=1"])
    assert config.job(SPEC, 4).strategy.tp_y == 2
    with pytest.raises(
        StrategyError, match=r"2-D tensor parallelism \(tp_y > 1\) of MoE layers, MLA, biases"
    ):
        config.job(replace(SPEC, bias=True), 4)


@pytest.mark.parametrize(
    "change",
    [{"tied_embeddings": True}, {"position": "learned", "norm": "layernorm", "bias": True}],
)
def test_tensor_parallel_lays_out_every_dense_family(change: dict) -> None:
    config = load_config(None, ["--parallel.strategy=tp=2,sp=1"])
    assert config.job(replace(SPEC, **change), 2).strategy.tp == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pp=2,memory_cap=4", "parallel.strategy: memory_cap: 1f1b does not take it"),
        ("pp=2,slices=2", "parallel.strategy: slices: 1f1b does not take it"),
        ("pp=2,schedule=svpp,vpp=2,slices=2,memory_cap=3", "below the dependency floor"),
    ],
)
def test_schedule_that_cannot_be_built_is_one_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):  # the Job builds its schedule
        _resolve(text, 2, "--train.global_batch_size=8", "--train.micro_batch_size=2")


def test_interleaved_needs_whole_rounds_of_micro_batches() -> None:
    with pytest.raises(ConfigError, match="interleaved needs a multiple of stages"):
        _resolve("pp=2,schedule=interleaved,vpp=2", 2, "--train.global_batch_size=6",
                 "--train.micro_batch_size=2")  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("pp=3", "must equal the device count 2"),
        ("pp=2,schedule=zb-h1,recompute=full", "recompute=full with zb-h1 is not executed"),
        ("pp=2,schedule=svpp,slices=2,memory_cap=1", "below the dependency floor"),
    ],
)
def test_cli_rejects_a_bad_strategy_before_launching(
    strategy: str, message: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["train", "--parallel.nproc=2", f"--parallel.strategy={strategy}", f"--run.dir={run}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("legato: error: parallel.strategy") and message in err
    assert "\n" not in err and not run.exists()


def test_example_tiny_pipeline_runs_svpp_on_its_processes() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "tiny_pipeline.toml")
    spec = resolve_model(config.model)
    schedule = config.job(spec, config.parallel.nproc).schedule
    assert (schedule.name, schedule.stages, schedule.placement.chunks, schedule.slices) == (
        "svpp", 2, 2, 4,
    )  # fmt: skip


def test_dualpipe_is_refused_by_the_trainer_in_one_line() -> None:
    with pytest.raises(ConfigError, match="schedule dualpipe is priced and simulated") as err:
        _resolve("pp=2,schedule=dualpipe", 2, "--train.global_batch_size=8")
    assert "\n" not in str(err.value)
