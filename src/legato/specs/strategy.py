"""Strategy: how one model is split over a cluster. The third word of the vocabulary.

It lives in ``specs`` (not ``plan``) because the cost model, the schedule builders, the
planner and the runtime all read it, and ``cost`` sits below ``plan`` in the layering.

Mesh convention (outer to inner, the order ranks are laid out): ``pp, dp, cp, tp``. Tensor
parallelism is innermost so its groups stay inside the fastest link level. Expert
parallelism folds over the ``dp x cp`` ranks of one pipeline stage when ``ep`` divides
``dp * cp``; otherwise (Megatron-Core's MoE parallel folding) it folds over the stage's
``tp x dp x cp`` ranks, tensor-parallel ranks first, and ``ep`` must divide
``tp * dp * cp`` (``etp = 1``: each rank dispatches its sequence-parallel token shard).
Expert tensor parallelism ``etp`` reuses tensor-parallel ranks and must divide ``tp``.
``expert_dp`` is the number of ranks holding the same experts (their gradient group).

Device-level techniques ride along because the cost model prices them and the planner
chooses them: ``moe_overlap`` (how an MoE layer hides its expert-parallel all-to-alls
behind the expert GEMMs: ``domino`` cuts tokens into ``moe_chunks``; ``comet`` computes
local rows first, then ``moe_chunks`` remote pieces with the second GEMM in
``moe_groups`` column groups), ``swap`` (every block's saved activations go to host
memory) and ``loss_chunk`` (tokens per chunk of the LM head + loss; 0 = unchunked).
``dtype="fp8"`` is tile-wise FP8 for the block linears (attention, router and LM head
stay in bf16).

Pipeline stages are balanced by default (``layer_ranges``). Megatron-LM's uneven splits,
which published runs use, are four keys (``stage_layers`` applies them):
``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first/last-pipeline-num-layers``:
the blocks of the first / last pipeline rank, the others split the rest evenly) and
``embedding_stage`` / ``loss_stage`` (``--account-for-embedding/loss-in-pipeline-split``:
the embedding / the LM head and loss count as one layer of the split, so the first /
last virtual stage holds one block fewer, none when a stage is one layer deep).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from itertools import accumulate
from typing import Literal

from legato.errors import LegatoError
from legato.specs.limits import MAX_BATCH, MAX_DEVICES, MAX_SIZE, MAX_STEPS, check_at_most
from legato.specs.model import ModelSpec
from legato.specs.schedules import MULTI_CHUNK, SCHEDULE_KINDS, SCHEDULES
from legato.specs.typed import FLAG_WORDS, key_value_items


class StrategyError(LegatoError):
    """A strategy is malformed or does not fit the model or the device count."""


Recompute = Literal["none", "selective", "full"]
Dtype = Literal["fp32", "fp16", "bf16", "fp8"]
MoEOverlap = Literal["none", "domino", "comet"]
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("fp32", "fp16", "bf16", "fp8")
MOE_OVERLAPS = ("none", "domino", "comet")
BOOLEANS = ("sp", "swap", "embedding_stage", "loss_stage")
ALWAYS_WRITTEN = ("dp", "tp", "pp", "zero", "mbs", "gbs", "dtype")
LOOSE_M = ("gpipe", "1f1b")  # schedules that run any number of micro-batches
# Largest value of each integer key (see legato.specs.limits for why these).
UPPER_BOUNDS = {
    **dict.fromkeys(("dp", "tp", "tp_y", "pp", "vpp", "cp", "ep", "etp"), MAX_DEVICES),
    **dict.fromkeys(("mbs", "gbs"), MAX_BATCH),
    **dict.fromkeys(("slices", "memory_cap", "moe_chunks", "moe_groups"), MAX_SIZE),
    **dict.fromkeys(("first_stage_layers", "last_stage_layers"), MAX_SIZE),
    "loss_chunk": MAX_STEPS,
}


@dataclass(frozen=True)
class Strategy:
    """Degrees of every parallel dimension plus batch, recompute and precision choices.

    ``tp`` is the total tensor-parallel degree; ``tp_y > 1`` makes it 2-D (``tp_x x tp_y``
    with ``tp_x = tp / tp_y``), written ``tp=4x2`` in strategy strings. ``zero`` is the
    ZeRO stage of the data-parallel axis (3 = FSDP). ``gbs`` and ``mbs`` count sequences.
    """

    dp: int = 1
    tp: int = 1
    tp_y: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False
    zero: int = 0
    mbs: int = 1
    gbs: int = 1
    schedule: str = "1f1b"
    slices: int = 1
    memory_cap: int = 0  # in-flight slice units per device for svpp; 0 = no cap
    recompute: Recompute = "none"
    dtype: Dtype = "bf16"
    moe_overlap: MoEOverlap = "none"
    moe_chunks: int = 1
    moe_groups: int = 1
    swap: bool = False
    loss_chunk: int = 0  # tokens per LM-head/loss chunk; 0 = all tokens at once
    first_stage_layers: int = 0  # blocks on the first pipeline rank; 0 = balanced
    last_stage_layers: int = 0  # blocks on the last pipeline rank; 0 = balanced
    embedding_stage: bool = False  # the embedding counts as a layer of the split
    loss_stage: bool = False  # the LM head and loss count as a layer of the split

    def __post_init__(self) -> None:
        positive = ("dp", "tp", "tp_y", "pp", "vpp", "cp", "ep", "etp", "mbs", "gbs", "slices")
        for name in (*positive, "moe_chunks", "moe_groups"):
            if getattr(self, name) < 1:
                raise StrategyError(f"strategy.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("memory_cap", "loss_chunk", "first_stage_layers", "last_stage_layers"):
            if getattr(self, name) < 0:
                raise StrategyError(f"strategy.{name} must be >= 0, got {getattr(self, name)}")
        zero_ok = ("memory_cap", "loss_chunk", "first_stage_layers", "last_stage_layers")
        for name, bound in UPPER_BOUNDS.items():
            low = 0 if name in zero_ok else 1
            check_at_most(f"strategy.{name}", getattr(self, name), bound, StrategyError, low)
        if self.tp % self.tp_y:
            raise StrategyError(f"strategy.tp_y ({self.tp_y}) must divide tp ({self.tp})")
        if self.zero not in (0, 1, 2, 3):
            raise StrategyError(f"strategy.zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.schedule not in SCHEDULES:
            raise StrategyError(
                f"strategy.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.recompute not in RECOMPUTE:
            raise StrategyError(
                f"strategy.recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}"
            )
        if self.dtype not in DTYPES:
            raise StrategyError(
                f"strategy.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.moe_overlap not in MOE_OVERLAPS:
            raise StrategyError(
                f"strategy.moe_overlap must be one of {', '.join(MOE_OVERLAPS)}, "
                f"got {self.moe_overlap!r}"
            )
        if self.moe_overlap == "none" and (self.moe_chunks > 1 or self.moe_groups > 1):
            raise StrategyError(
                f"strategy: moe_chunks={self.moe_chunks}, moe_groups={self.moe_groups} need "
                f"moe_overlap domino or comet, got none"
            )

    @property
    def tp_x(self) -> int:
        return self.tp // self.tp_y

    @property
    def folded_ep(self) -> bool:
        """Expert parallelism spans tensor-parallel ranks (``ep`` does not divide dp*cp)."""
        return self.ep > 1 and (self.dp * self.cp) % self.ep != 0

    @property
    def uneven_stages(self) -> bool:
        """One of Megatron's uneven pipeline splits is asked for (``stage_layers``)."""
        return bool(
            self.first_stage_layers
            or self.last_stage_layers
            or self.embedding_stage
            or self.loss_stage
        )

    @property
    def expert_dp(self) -> int:
        """Ranks of a stage that hold the same expert weights (their gradient group)."""
        ranks = self.tp * self.dp * self.cp if self.folded_ep else self.dp * self.cp
        return max(1, ranks // self.ep)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step on each pipeline (data-parallel replica)."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def model_copies(self) -> int:
        """Copies of its share of the model a pipeline device holds: 2 under DualPipe
        (one per direction; each micro-batch crosses one), else 1."""
        return SCHEDULE_KINDS[self.schedule].model_copies

    def check(self, model: ModelSpec, devices: int | None = None) -> None:
        """Raise StrategyError naming the first constraint this strategy violates."""
        if devices is not None and self.world_size != devices:
            raise StrategyError(
                f"strategy: pp*dp*cp*tp = {self.pp}*{self.dp}*{self.cp}*{self.tp} = "
                f"{self.world_size} must equal the device count {devices}"
            )
        # 1-D TP splits heads over all tp ranks; 2-D TP splits them over tp_y only (tp_x
        # splits the sequence), as in the weight-stationary layout of the planner.
        heads_split, name = (self.tp_y, "tp_y") if self.tp_y > 1 else (self.tp, "tp")
        _divides(heads_split, model.num_heads, name, "num_heads")
        _divides(heads_split, model.num_kv_heads, name, "num_kv_heads")
        chunks = self.pp * self.vpp
        if chunks > model.num_layers and not self.uneven_stages:
            raise StrategyError(
                f"strategy: pp*vpp ({chunks}) must be at most num_layers "
                f"({model.num_layers}): every virtual stage holds a layer"
            )
        stage_layers(model.num_layers, self)  # an uneven split's own rules
        if self.gbs % (self.mbs * self.dp):
            raise StrategyError(
                f"strategy: gbs ({self.gbs}) must be a multiple of mbs*dp "
                f"({self.mbs}*{self.dp} = {self.mbs * self.dp})"
            )
        # 1F1B with fewer micro-batches than stages warms up with all of them and runs as
        # GPipe (Megatron's warm-up is min(pp - rank - 1, m)); the others need m >= pp.
        if self.pp > 1 and self.num_microbatches < self.pp and self.schedule not in LOOSE_M:
            raise StrategyError(
                f"strategy: {self.schedule} needs at least pp={self.pp} micro-batches per "
                f"step, got gbs/(mbs*dp) = {self.num_microbatches}"
            )
        if self.schedule == "dualpipe":
            m = self.num_microbatches
            if self.pp % 2 or m % 2 or m < 2 * self.pp or self.vpp > 1 or self.slices > 1:
                raise StrategyError(
                    f"strategy: dualpipe needs an even pp, an even number of micro-batches "
                    f"of at least 2*pp (half enter from each end), vpp=1 and slices=1, got "
                    f"pp={self.pp}, gbs/(mbs*dp) = {m}, vpp={self.vpp}, slices={self.slices}"
                )
        if self.vpp > 1 and self.schedule not in MULTI_CHUNK:
            raise StrategyError(
                f"strategy: vpp={self.vpp} needs schedule {', '.join(MULTI_CHUNK[:-1])} or "
                f"{MULTI_CHUNK[-1]}, "
                f"got {self.schedule}"
            )
        _divides(2 * self.cp if self.cp > 1 else 1, model.seq_len, "2*cp", "seq_len")
        _divides(self.slices, model.seq_len, "slices", "seq_len")
        if self.sp and self.tp == 1:
            raise StrategyError("strategy: sp (sequence parallel) needs tp > 1")
        if self.ep > 1 or self.etp > 1:
            if model.moe is None:
                raise StrategyError(f"strategy: ep/etp need an MoE model; {model.name} is dense")
            _divides(self.ep, model.moe.num_experts, "ep", "moe.num_experts")
            _divides(self.ep, self.tp * self.dp * self.cp, "ep", "tp*dp*cp")
            _divides(self.etp, self.tp, "etp", "tp")
            if self.folded_ep and (self.etp > 1 or self.tp_y > 1 or (self.tp > 1 and not self.sp)):
                raise StrategyError(
                    f"strategy: ep={self.ep} does not divide dp*cp ({self.dp * self.cp}), so it "
                    f"folds over tensor-parallel ranks: that needs etp=1, 1-D tp and sp=1 (each "
                    f"rank dispatches its own token shard), got etp={self.etp}, "
                    f"tp={self.tp_x}x{self.tp_y}, sp={int(self.sp)}"
                )
        if self.moe_overlap != "none":
            name = f"moe_overlap={self.moe_overlap}"
            if model.moe is None:
                raise StrategyError(f"strategy: {name} needs an MoE model; {model.name} is dense")
            if self.ep == 1:
                raise StrategyError(f"strategy: {name} needs ep > 1 (nothing to overlap), got ep=1")
            if self.etp > 1:
                raise StrategyError(
                    f"strategy: {name} needs etp=1 (the overlap schedules run whole experts), "
                    f"got etp={self.etp}"
                )

    def to_string(self) -> str:
        """Canonical ``key=value`` form: the degrees, ZeRO stage, batch sizes and dtype
        always (a runtime's defaults for those may differ, so a pasted string must say
        them), every other field only where it differs from the default."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tp_y" or (value == f.default and f.name not in ALWAYS_WRITTEN):
                continue
            if f.name == "tp" and self.tp_y > 1:
                parts.append(f"tp={self.tp_x}x{self.tp_y}")
            elif isinstance(value, bool):
                parts.append(f"{f.name}={int(value)}")
            else:
                parts.append(f"{f.name}={value}")
        return ",".join(parts)

    def with_(self, **changes) -> Strategy:
        return replace(self, **changes)

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """Parse ``dp=32,tp=2,pp=1,mbs=8,gbs=512,recompute=full,schedule=1f1b,dtype=fp16``
        (and ``ep=8,moe_overlap=comet,moe_chunks=4,moe_groups=2,swap=1,loss_chunk=4096``)."""
        allowed = [f.name for f in fields(cls) if f.name != "tp_y"]
        kwargs: dict[str, object] = {}
        for key, value in key_value_items(text, allowed, "strategy", StrategyError):
            kwargs.update(_parse_value(key, value))
        return cls(**kwargs)


def _parse_value(key: str, value: str) -> dict[str, object]:
    if key in ("schedule", "recompute", "dtype", "moe_overlap"):
        return {key: value}
    if key in BOOLEANS:
        if value.lower() not in FLAG_WORDS:
            raise StrategyError(f"strategy.{key} must be 0/1/true/false, got {value!r}")
        return {key: FLAG_WORDS[value.lower()]}
    if key == "tp" and "x" in value:
        x, _, y = value.partition("x")
        tp_x, tp_y = _int(key, x), _int(key, y)
        return {"tp": tp_x * tp_y, "tp_y": tp_y}
    return {key: _int(key, value)}


def _int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise StrategyError(f"strategy.{key} must be an integer, got {value!r}") from None


def layer_ranges(num_layers: int, chunks: int) -> tuple[range, ...]:
    """The contiguous block range of each of ``chunks`` virtual pipeline stages, in order:
    balanced, the extra layers of an uneven split on the earliest stages (the last
    carries the LM head and the loss). The cost model prices and the runtime builds this
    same split."""
    counts = _balanced(num_layers, chunks)
    return tuple(range(start, start + n) for start, n in zip(accumulate(counts, initial=0),
                                                             counts, strict=False))  # fmt: skip


def stage_layers(num_layers: int, s: Strategy) -> tuple[int, ...]:
    """Blocks of each virtual stage in model order, as the cost model prices and the
    runtime builds them: ``layer_ranges``'s balanced split, or the strategy's uneven one.

    Uneven splits follow Megatron-LM (``get_num_layers_to_build``): the pipeline ranks'
    counts first (``first_stage_layers`` / ``last_stage_layers`` given, the rest split
    evenly over the other ranks; or ``num_layers`` plus the embedding and loss slots
    balanced over the ranks), then each rank's count balanced over its chunks, then the
    first / last virtual stage gives a block to the embedding / the loss. Chunk c of rank
    r is virtual stage ``c p + r``, in ZB-V's V ``c p + p - 1 - r`` for odd c; DualPipe's
    split is of one model copy over the p ranks."""
    v = 1 if s.model_copies > 1 else SCHEDULE_KINDS[s.schedule].chunks_for(s.vpp)
    return _stage_layers(
        num_layers, s.pp, v, s.schedule == "zb-v", s.first_stage_layers,
        s.last_stage_layers, s.embedding_stage, s.loss_stage,
    )  # fmt: skip


@cache  # asked for every candidate the planner scores
def _stage_layers(
    num_layers: int, p: int, v: int, v_shape: bool, first: int, last: int, embedding: bool,
    loss: bool,
) -> tuple[int, ...]:  # fmt: skip
    chunks = p * v
    if not (first or last or embedding or loss):
        return _balanced(num_layers, chunks)
    edges = int(embedding) + int(loss)
    text = (
        f"first_stage_layers={first}, last_stage_layers={last}, "
        f"embedding_stage={int(embedding)}, loss_stage={int(loss)}"
    )
    if p == 1:
        raise StrategyError(f"strategy: {text} shape pipeline stages: they need pp > 1")
    if edges and (first or last):
        raise StrategyError(
            f"strategy: {text}: give the first/last stages' layers or count the embedding "
            f"and loss as layers, not both (as Megatron-LM)"
        )
    if edges:
        per_rank = _balanced(num_layers + edges, p)
    else:
        fixed = {r: n for r, n in ((0, first), (p - 1, last)) if n}
        rest, ranks = num_layers - sum(fixed.values()), p - len(fixed)
        if rest < ranks or (ranks and rest % ranks) or (not ranks and rest):
            raise StrategyError(
                f"strategy: {text} leave {rest} of num_layers ({num_layers}) to the other "
                f"{ranks} pipeline ranks: they must split them evenly, one or more each"
            )
        per_rank = tuple(fixed.get(r, rest // max(ranks, 1)) for r in range(p))
    counts = []
    for stage in range(chunks):
        c, offset = divmod(stage, p)
        rank = p - 1 - offset if v_shape and c % 2 else offset
        counts.append(_balanced(per_rank[rank], v)[c])
    counts[0] -= embedding
    counts[-1] -= loss
    holds_edge = {0: embedding, chunks - 1: loss}
    empty = [i for i, n in enumerate(counts) if n < 0 or (n == 0 and not holds_edge.get(i))]
    if empty:
        raise StrategyError(
            f"strategy: {text} leave virtual stage {empty[0]} of {chunks} without a layer "
            f"(blocks per stage: {counts}); every stage holds one, or only the embedding "
            f"or the loss"
        )
    return tuple(counts)


def _balanced(total: int, parts: int) -> tuple[int, ...]:
    """``layer_ranges``'s lengths: the extra ones on the earliest parts."""
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


def _divides(divisor: int, total: int, divisor_name: str, total_name: str) -> None:
    if total % divisor:
        raise StrategyError(
            f"strategy: {divisor_name} ({divisor}) must divide {total_name} ({total})"
        )
