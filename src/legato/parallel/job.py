"""The Job: ``parallel.strategy`` resolved once, before any process starts, for one run.

A ``Job`` is what every rank of a run reads: the complete ``Strategy`` (``dp`` derived,
``zero``, batch sizes and precision filled in), the trained dtype, the pipeline schedule
(pp > 1) and the mesh shape. Nothing re-parses the strategy string after this; nothing
keeps a second copy of its fields. Pure Python (no torch), so the command line rejects a
strategy the runtime cannot place before it launches a process.

What ``legato train`` executes (``legato.parallel.parallelize``): every key of the
priced keys' table (``specs.priced_keys``) on every model family -- ``dp`` with ``zero``
0 (DDP), 1 (optimizer states and gradients sharded, parameters gathered for the whole
step), 2 (FSDP2, parameters kept gathered between forward and backward) or 3 (FSDP2,
resharded after forward); ``tp`` (Megatron column/row through ``parallelize_module``,
vocabulary-parallel embedding, LM head and loss; MoE, MLA and tied embeddings through
``tensor_families``) with ``sp``; ``cp`` (attention over a load-balanced sequence split);
``ep`` (experts sharded over the ``dp x cp`` ranks, or folded over tp and dp: over every
rank of a stage) with ``etp`` (each expert's FFN width split over tp); ``recompute``
(selective or full); ``swap`` and ``loss_chunk``; ``pp`` with every schedule of
``legato.schedule`` but DualPipe (two model copies; refused in one line), its stages laid
out by the same appliers; 2-D tp (``tp=AxB``, the planner's layout run op by op);
``dtype`` (fp16 with dynamic loss scaling), ``mbs``, ``gbs``. What is refused: the combinations of ``_check_runtime`` and
``check_tensor_parallel``, each with its reason (docs/training.md lists them). The keys
``mbs``, ``gbs`` and ``dtype`` of the string *are* the config's ``train.micro_batch_size``,
``train.global_batch_size`` and ``train.dtype`` (``owned_by_train``): a strategy printed by
``legato plan`` can be pasted unchanged.

Micro-batches per step on each pipeline (data-parallel replica)::

    m = gbs / (mbs * dp)

the gradient-accumulation count when ``pp = 1`` and the schedule's micro-batch count when
``pp > 1``. That is the even split, which ``legato predict`` and the cost model price; with
uneven local batches (``train.batch_split``, pp = 1 only) the step runs
``batch_split.microbatch_count`` micro-batches instead, at least as many.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from legato.errors import ConfigError
from legato.schedule import Schedule, ScheduleError, build_schedule, token_bounds
from legato.specs.dtypes import DTYPE_KINDS
from legato.specs.model import ModelSpec
from legato.specs.schedules import SCHEDULE_KINDS
from legato.specs.strategy import Strategy, StrategyError

FIELD = "parallel.strategy"
AUTO = "auto"
# strategy key -> the config field it sets (the same number, written in one place)
OWNED_BY_TRAIN = {
    "mbs": "train.micro_batch_size",
    "gbs": "train.global_batch_size",
    "dtype": "train.dtype",
}
# strategy dtype -> the trained dtype it means
TRAINED_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
PIPELINE_ONLY = ("vpp", "schedule", "slices", "memory_cap")


def given_keys(text: str) -> list[str]:
    """The keys written in a strategy string (after ``Strategy.parse`` accepted it)."""
    return [item.partition("=")[0].strip() for item in text.split(",") if item.strip()]


def parse_strategy(text: str) -> Strategy:
    """``parallel.strategy`` as a Strategy: a ConfigError for its syntax or pipeline
    options without a pipeline."""
    try:
        strategy = Strategy.parse(text)
    except StrategyError as exc:
        raise ConfigError(f"{FIELD}: {exc}") from None
    default = Strategy()
    keys = given_keys(text)
    pipeline_options = [
        k
        for k in PIPELINE_ONLY
        if k in keys and (k == "schedule" or getattr(strategy, k) != getattr(default, k))
    ]
    if strategy.pp == 1 and pipeline_options:
        raise ConfigError(f"{FIELD}: {', '.join(pipeline_options)} need pp > 1, got {text!r}")
    return strategy


def owned_by_train(text: str) -> dict[str, Any]:
    """The ``train`` fields a strategy string sets (``{"micro_batch_size": 4, ...}``):
    empty for '' and 'auto'."""
    if not text or text == AUTO:
        return {}
    strategy, keys = parse_strategy(text), given_keys(text)
    values = {"mbs": strategy.mbs, "gbs": strategy.gbs, "dtype": TRAINED_DTYPE[strategy.dtype]}
    return {OWNED_BY_TRAIN[k].split(".")[1]: values[k] for k in OWNED_BY_TRAIN if k in keys}


@dataclass(frozen=True)
class Job:
    """One run's layout, resolved once. ``dtype`` is the trained dtype (``train.dtype``:
    fp32, bf16, fp8, fp8-rowwise); ``strategy.dtype`` is how the cost model prices it.
    ``prediction``: the cost model's answer for this job, when one was made."""

    strategy: Strategy
    dtype: str
    schedule: Schedule | None = None
    prediction: Any = None

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The mesh dimensions, outer to inner (``cost/mesh.py``'s rank order); 2-D tensor
        parallelism splits ``tp`` into ``tp_y`` and ``tp_x`` (innermost)."""
        s = self.strategy
        tp = {"tp_y": s.tp_y, "tp_x": s.tp_x} if s.tp_y > 1 else {"tp": s.tp}
        return {"pp": s.pp, "dp": s.dp, "cp": s.cp, **tp}

    @property
    def gradient_ranks(self) -> int:
        """Ranks that see different tokens and average one weight's gradient (dp x cp)."""
        return self.strategy.dp * self.strategy.cp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step of the even split (``gbs / (mbs * dp)``), the count the
        prediction prices; a ``train.batch_split`` may run more (``batch_split``)."""
        return self.strategy.num_microbatches

    def describe(self) -> str:
        """The layout in one phrase, e.g. ``tp=2 (sp) x dp=2, FSDP2 (zero=3)``."""
        s = self.strategy
        parts = [f"pp={s.pp}"] if s.pp > 1 else []
        if s.tp > 1:
            parts.append(f"tp={s.tp_x}x{s.tp_y}" if s.tp_y > 1 else f"tp={s.tp}")
            parts[-1] += " (sp)" if s.sp else ""
        parts += [f"cp={s.cp}"] if s.cp > 1 else []
        parts.append(f"dp={s.dp}")
        text = " x ".join(parts)
        if self.gradient_ranks > 1:
            text += f", {_ZERO_NAMES[s.zero]} (zero={s.zero})"
        extras = []
        if s.pp > 1:
            extras.append(_describe_schedule(s))
        if s.ep > 1:
            where = " folded over tp" if s.folded_ep else ""
            where += f", each expert on {s.expert_dp} ranks" if s.expert_dp > 1 else ""
            overlap = "" if s.moe_overlap == "none" else f" {s.moe_overlap}"
            overlap += f" {s.moe_chunks}x{s.moe_groups}" if overlap else ""
            extras.append(f"ep={s.ep}{where}{overlap}")
        extras += [f"recompute={s.recompute}"] if s.recompute != "none" else []
        extras += ["swap"] if s.swap else []
        extras += [f"loss_chunk={s.loss_chunk}"] if s.loss_chunk else []
        return f"{text}, {', '.join(extras)}" if extras else text


_ZERO_NAMES = {0: "DDP", 1: "sharded optimizer", 2: "FSDP2", 3: "FSDP2"}


def _describe_schedule(s: Strategy) -> str:
    parts = [f"vpp={s.vpp}"] if s.vpp > 1 else []
    parts += [f"slices={s.slices}"] if s.slices > 1 else []
    parts += [f"memory_cap={s.memory_cap}"] if s.memory_cap else []
    return f"{s.schedule} ({', '.join(parts)})" if parts else s.schedule


def resolve_job(
    text: str, spec: ModelSpec, world: int, *, mbs: int, gbs: int, dtype: str, seq_len: int
) -> Job:
    """The job ``text`` describes on ``world`` processes for sequences of ``seq_len``
    tokens, batch sizes and dtype from the config (which the string, if it gives them,
    has already set): one-line errors naming the key for anything that cannot run."""
    strategy = parse_strategy(text)
    if strategy.model_copies > 1:
        raise ConfigError(
            f"{FIELD}: schedule {strategy.schedule} is priced and simulated (legato predict, "
            f"plan --schedules, schedule simulate) but the trainer does not run it; zb-v "
            f"runs its V of two chunks with one model copy"
        )
    keys = given_keys(text)
    dp = strategy.dp
    if "dp" not in keys:
        dp = max(1, world // (strategy.pp * strategy.tp * strategy.cp))
    fixed = SCHEDULE_KINDS[strategy.schedule].chunks
    if fixed not in (None, 1) and strategy.vpp not in (1, fixed):  # zb-v: a V of 2 chunks
        raise ConfigError(
            f"{FIELD}: {strategy.schedule} has exactly {fixed} chunks per rank, "
            f"got vpp={strategy.vpp}"
        )
    vpp = strategy.vpp if fixed in (None, 1) else fixed  # vpp > 1 with one chunk: refused below
    zero = strategy.zero
    if "zero" not in keys:  # FSDP2 for data parallelism, a flat all-reduce in a pipeline
        zero = 3 if strategy.pp == 1 and dp * strategy.cp > 1 else 0
        zero = 1 if strategy.pp > 1 and strategy.ep > 1 else zero  # experts need FSDP2
    strategy = strategy.with_(
        dp=dp, vpp=vpp, zero=zero, mbs=mbs, gbs=gbs, dtype=DTYPE_KINDS[dtype].priced_as
    )
    where = f"{FIELD} = {text!r} on {world} processes"
    try:
        strategy.check(spec, world)
    except StrategyError as exc:
        raise StrategyError(f"{where}: {exc}") from None
    # built once, when a check or the job first needs it (the planner resolves a job per
    # candidate, and a cost-driven schedule is not free to build)
    schedule = functools.cache(functools.partial(pipeline_schedule, strategy))
    _check_runtime(strategy, spec, seq_len, where, schedule)
    return Job(strategy, dtype, schedule() if strategy.pp > 1 else None)


def _check_runtime(
    s: Strategy, spec: ModelSpec, seq_len: int, where: str, schedule: Callable[[], Schedule]
) -> None:
    """What the runtime adds to ``Strategy.check``: the sequence the data really has, and
    the combinations whose pieces cannot hold each other. ``schedule``: the pipeline's
    (pp > 1), built on first call."""
    try:
        check_context_parallel(s.cp, seq_len)
        check_tensor_parallel(spec, s)
    except StrategyError as exc:
        raise StrategyError(f"{where}: {exc}") from None
    if s.slices > 1 and seq_len % s.slices:
        raise StrategyError(f"{where}: slices={s.slices} must divide data.seq_len ({seq_len})")
    if s.slices > 1 and s.cp > 1:
        check_context_slices(s, token_bounds(schedule().slice_bounds, seq_len), where)
    if s.sp:
        check_sequence_parallel(s, seq_len, where, schedule)
    if s.pp > 1 and s.recompute == "full" and SCHEDULE_KINDS[s.schedule].split_backward:
        raise StrategyError(
            f"{where}: recompute=full with {s.schedule} is not executed (a block recomputed "
            f"in B would need its deferred weight gradients recorded again for W); use "
            f"recompute=selective or a schedule without split backward "
            f"({', '.join(k for k, v in SCHEDULE_KINDS.items() if not v.split_backward)})"
        )
    data_parallel = s.dp * s.cp > 1
    if s.etp > 1:
        check_expert_tensor_parallel(spec, s, where)
    if s.pp > 1 and data_parallel and s.zero and spec.tied_embeddings and _folded(schedule()):
        raise StrategyError(
            f"{where}: zero={s.zero} with tied_embeddings under {s.schedule} (one rank holds "
            f"the first and the last stage, which would shard the embedding twice); use "
            f"zero=0 or a schedule without a V placement"
        )


def check_expert_tensor_parallel(spec: ModelSpec, s: Strategy, where: str) -> None:
    """etp splits every expert's FFN width over all the tp ranks: evenly, and without a
    bias inside the row-parallel down projection (each rank would add it once)."""
    ffn = spec.moe.expert_ffn_hidden_size if spec.moe else 0
    problems = {
        f"etp={s.etp} must equal tp={s.tp} (each expert's FFN split over all the "
        f"tensor-parallel ranks, which share its tokens)": s.etp != s.tp,
        f"etp={s.etp} must divide the experts' FFN width ({ffn})": ffn % s.etp != 0,
        f"etp={s.etp} runs experts without biases (a row-parallel bias would be added "
        f"once per rank); {spec.name} has bias = true": spec.bias,
    }
    why = [text for text, hit in problems.items() if hit]
    if why:
        raise StrategyError(f"{where}: {why[0]}")


def check_sequence_parallel(
    s: Strategy, seq_len: int, where: str, schedule: Callable[[], Schedule]
) -> None:
    """sp splits every piece of sequence a stage sees (the whole sequence, or each slice
    of a slice-level schedule) over the tp ranks: tp must divide each one's tokens."""
    cuts = token_bounds(schedule().slice_bounds, seq_len) if s.pp > 1 else (0, seq_len)
    pieces = [(b - a) // s.cp for a, b in pairwise(cuts)]  # each cp rank's share
    if any(n % s.tp for n in pieces):
        raise StrategyError(
            f"{where}: sp needs tp={s.tp} to divide the tokens of every sequence piece a "
            f"stage runs, got {pieces} (data.seq_len {seq_len}, slices={s.slices})"
        )


def _folded(schedule: Schedule) -> bool:
    """Whether the schedule puts the first and the last stage on one pipeline rank."""
    placement = schedule.placement
    return placement.rank(0) == placement.rank(placement.num_stages - 1)


def check_tensor_parallel(spec: ModelSpec, strategy: Strategy) -> None:
    """StrategyError naming what of ``spec`` the tensor-parallel appliers cannot split."""
    if strategy.tp == 1:
        return
    two_d = strategy.tp_y > 1
    refused = {
        "2-D tensor parallelism (tp_y > 1) of MoE layers, MLA, biases, qk_norm, LayerNorm "
        "or learned positions (the planner's 2-D layout covers Llama dense blocks)": two_d
        and (
            spec.is_moe
            or spec.mla is not None
            or spec.bias
            or spec.qk_norm
            or spec.norm != "rmsnorm"
            or spec.position != "rope"
        ),
        "dtype=fp8 with 2-D tp (each block runs the planner's layout op by op, not its "
        "modules)": strategy.dtype == "fp8" and two_d,
        "loss_chunk > 0 with 2-D tp (the chunked head is split on the vocabulary over one "
        "dimension)": strategy.loss_chunk > 0 and two_d,
    }
    why = [name for name, hit in refused.items() if hit]
    if why:
        raise StrategyError(
            f"strategy.tp: tp={strategy.tp} is not executed for {', '.join(why)}; "
            f"use tp=1 (dp, cp, pp and zero run every model)"
        )


def check_context_slices(s: Strategy, cuts: tuple[int, ...], where: str) -> None:
    """cp with sequence slices splits every slice over the cp ranks as it would a whole
    sequence (``2 * cp`` zigzag chunks): ``2 * cp`` must divide each slice's tokens."""
    pieces = [b - a for a, b in pairwise(cuts)]
    if any(n % (2 * s.cp) for n in pieces):
        raise StrategyError(
            f"{where}: cp={s.cp} with slices={s.slices} cuts every slice into 2*cp = "
            f"{2 * s.cp} chunks, got slices of {pieces} tokens"
        )


def check_context_parallel(cp: int, seq_len: int, field: str = "data.seq_len") -> None:
    """Raise StrategyError unless ``2 * cp`` divides the sequence length the model sees
    (``field`` names where that length comes from)."""
    if cp > 1 and seq_len % (2 * cp):
        allowed = ", ".join(str(d) for d in range(1, seq_len // 2 + 1) if seq_len % (2 * d) == 0)
        raise StrategyError(
            f"strategy.cp: cp={cp} needs {field} ({seq_len}) to be a multiple of 2*cp = "
            f"{2 * cp} (each sequence is cut into 2*cp equal chunks); allowed: cp = {allowed}"
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
