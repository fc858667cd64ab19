"""``parallel.strategy``: the ``Strategy`` string the trainer executes, resolved for a job.

Pure Python (no torch), so the command line rejects a strategy before it launches a
process. What the trainer runs: with ``pp = 1``, data parallelism over every process
(FSDP2, or DDP with ``parallel.fsdp = false``); with ``pp > 1``, a pipeline of ``pp``
ranks running any schedule of ``legato.schedule`` (``vpp`` chunks, ``slices``,
``memory_cap``), replicated ``dp`` times (``train.pipeline_step``). With pp = 1 also:
expert parallelism (``ep`` = ``dp``, with ``moe_overlap``, ``moe_chunks``, ``moe_groups``),
activation ``swap`` and the chunked loss (``loss_chunk``). ``dp`` is derived as
``world / (pp * tp * cp)`` unless given. Batch sizes and precision come from the ``train``
section (given in the string, they must agree); every other key (``tp``, ``cp``, ...)
is accepted at its default only, until the trainer executes it.

Micro-batches per step on each pipeline (data-parallel replica)::

    m = train.global_batch_size / (train.micro_batch_size * dp)

which is the gradient-accumulation count when ``pp = 1`` and the schedule's micro-batch
count when ``pp > 1``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from legato.errors import ConfigError
from legato.schedule import Schedule, ScheduleError, build_schedule
from legato.specs.dtypes import DTYPE_KINDS
from legato.specs.model import ModelSpec
from legato.specs.schedules import SCHEDULE_KINDS
from legato.specs.strategy import Strategy, StrategyError

if TYPE_CHECKING:
    from legato.train.config import TrainConfig

FIELD = "parallel.strategy"
# Keys a strategy string may set for the trainer; extend as the trainer learns more.
SUPPORTED = (
    "dp",
    "pp",
    "vpp",
    "schedule",
    "slices",
    "memory_cap",
    "ep",
    "moe_overlap",
    "moe_chunks",
    "moe_groups",
    "swap",
    "loss_chunk",
)
# Keys whose value another config field owns: given, they must agree with it (so a
# planner's strategy string can be pasted as it is).
OWNED_ELSEWHERE = {
    "mbs": "train.micro_batch_size",
    "gbs": "train.global_batch_size",
    "dtype": "train.dtype",
    "zero": "parallel.fsdp",
}
PIPELINE_ONLY = ("vpp", "schedule", "slices", "memory_cap")
# Keys the data-parallel path (pp = 1) runs and the pipeline runtime does not.
DATA_PARALLEL_ONLY = ("ep", "moe_overlap", "swap", "loss_chunk")


def given_keys(text: str) -> list[str]:
    """The keys written in a strategy string (after ``Strategy.parse`` accepted it)."""
    return [item.partition("=")[0].strip() for item in text.split(",") if item.strip()]


def parse_strategy(text: str) -> Strategy:
    """``parallel.strategy`` as a Strategy; a ConfigError for syntax or anything the
    trainer cannot execute yet."""
    try:
        strategy = Strategy.parse(text)
    except StrategyError as exc:
        raise ConfigError(f"{FIELD}: {exc}") from None
    default = Strategy()
    keys = given_keys(text)
    for f in fields(Strategy):  # any other field (tp, cp, ep, ...) must keep its default
        key = f.name
        if (
            key not in SUPPORTED
            and key not in OWNED_ELSEWHERE
            and getattr(strategy, key) != f.default
        ):
            raise ConfigError(
                f"{FIELD}: {key}={getattr(strategy, key)} is not executed by the trainer yet; "
                f"it runs {', '.join(SUPPORTED)} (everything else at its default)"
            )
    pipeline_options = [
        k
        for k in PIPELINE_ONLY
        if k in keys and (k == "schedule" or getattr(strategy, k) != getattr(default, k))
    ]
    if strategy.pp == 1 and pipeline_options:
        raise ConfigError(f"{FIELD}: {', '.join(pipeline_options)} need pp > 1, got {text!r}")
    dp_options = [k for k in DATA_PARALLEL_ONLY if getattr(strategy, k) != getattr(default, k)]
    if strategy.pp > 1 and dp_options:
        raise ConfigError(
            f"{FIELD}: {', '.join(dp_options)} run with pp = 1 only (the pipeline runtime "
            f"does not execute them yet), got {text!r}"
        )
    return strategy


def resolve_strategy(config: TrainConfig, spec: ModelSpec, world: int) -> Strategy:
    """The strategy the job runs on ``world`` processes: dp derived, batch sizes and
    precision from the config, checked against the model (one-line StrategyError)."""
    text = config.parallel.strategy
    strategy = parse_strategy(text)
    dp = strategy.dp
    if "dp" not in given_keys(text):
        dp = max(1, world // (strategy.pp * strategy.tp * strategy.cp))
    config.grad_accum_steps(dp)  # the batch sizes must divide: a ConfigError naming them
    fixed = SCHEDULE_KINDS[strategy.schedule].chunks
    if fixed not in (None, 1) and strategy.vpp not in (1, fixed):  # zb-v: a V of 2 chunks
        raise ConfigError(
            f"{FIELD}: {strategy.schedule} has exactly {fixed} chunks per rank, "
            f"got vpp={strategy.vpp}"
        )
    vpp = strategy.vpp if fixed in (None, 1) else fixed  # vpp > 1 with one chunk: refused below
    owned = {
        "mbs": config.train.micro_batch_size,
        "gbs": config.train.global_batch_size,
        "dtype": DTYPE_KINDS[config.train.dtype].priced_as,
        "zero": 3 if strategy.pp == 1 and config.parallel.fsdp and world > 1 else 0,
    }
    for key, value in owned.items():
        if key in given_keys(text) and getattr(strategy, key) != value:
            raise ConfigError(
                f"{FIELD}: {key}={getattr(strategy, key)} disagrees with "
                f"{OWNED_ELSEWHERE[key]} ({value} here); drop it or make them equal"
            )
    strategy = strategy.with_(dp=dp, vpp=vpp, **owned)
    try:
        strategy.check(spec, world)
    except StrategyError as exc:
        raise StrategyError(f"{FIELD} = {text!r} on {world} processes: {exc}") from None
    _check_data_parallel_options(strategy, config, world)
    if strategy.pp > 1 and spec.is_moe and config.train.moe_aux_loss_coef > 0:
        raise ConfigError(
            "train.moe_aux_loss_coef: the pipeline runtime does not add the MoE load-balance "
            "loss yet; set it to 0 or use pp = 1"
        )
    return strategy


def _check_data_parallel_options(strategy: Strategy, config: TrainConfig, world: int) -> None:
    """What the trainer's EP runs today: experts sharded over all data-parallel ranks
    (ep = dp), the dense parts by FSDP2 (DDP cannot hold the experts' DTensors). The
    chunked loss calls the model's ``hidden_states``, which DDP's forward does not see."""
    ddp = world > 1 and not config.parallel.fsdp
    if strategy.loss_chunk and ddp:
        raise ConfigError(
            "parallel.fsdp: the chunked loss (loss_chunk > 0) runs with FSDP2 or one process, "
            "not DDP; set parallel.fsdp = true or loss_chunk=0"
        )
    if strategy.ep == 1:
        return
    if strategy.ep != strategy.dp:
        raise ConfigError(
            f"{FIELD}: ep={strategy.ep} must equal dp={strategy.dp} (experts sharded over "
            f"all {world} processes; ep < dp is not run yet)"
        )
    if ddp:
        raise ConfigError(
            "parallel.fsdp: expert parallelism (ep > 1) needs FSDP2 (true); DDP cannot hold "
            "the experts' DTensors"
        )


def pipeline_schedule(strategy: Strategy) -> Schedule:
    """The schedule a pipeline strategy runs: ``strategy.num_microbatches`` micro-batches,
    ``vpp`` -> chunks, ``slices``, ``memory_cap`` (0 = the builder's default)."""
    name = strategy.schedule
    options: dict[str, int] = {}
    if name in ("interleaved", "svpp"):
        options["chunks"] = strategy.vpp
    if name in ("seq1f1b", "svpp") or strategy.slices > 1:
        options["slices"] = strategy.slices
    if strategy.memory_cap:
        options["memory_cap"] = strategy.memory_cap
    try:
        return build_schedule(
            name, stages=strategy.pp, microbatches=strategy.num_microbatches, **options
        )
    except ScheduleError as exc:
        raise ConfigError(f"{FIELD}: {exc}") from None


def describe(strategy: Strategy) -> str:
    """One phrase for the progress header, e.g. ``pp=2 x dp=1, svpp (vpp=2, slices=4)``."""
    parts = [f"vpp={strategy.vpp}"] if strategy.vpp > 1 else []
    parts += [f"slices={strategy.slices}"] if strategy.slices > 1 else []
    parts += [f"memory_cap={strategy.memory_cap}"] if strategy.memory_cap else []
    extra = f" ({', '.join(parts)})" if parts else ""
    return f"pp={strategy.pp} x dp={strategy.dp}, {strategy.schedule}{extra}"


def describe_device(strategy: Strategy) -> str:
    """The expert-parallel and memory options of a pp = 1 job, e.g. ``ep=2 comet 2x2,
    swap, loss_chunk=1024``; '' when none is on."""
    parts = []
    if strategy.ep > 1:
        overlap = strategy.moe_overlap
        if overlap != "none":
            overlap += f" {strategy.moe_chunks}x{strategy.moe_groups}"
        parts.append(f"ep={strategy.ep} {overlap}")
    parts += ["swap"] if strategy.swap else []
    parts += [f"loss_chunk={strategy.loss_chunk}"] if strategy.loss_chunk else []
    return ", ".join(parts)
