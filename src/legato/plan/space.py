"""The parallel search space: factorisations of the device count and, for each, the
execution and memory options worth scoring.

The space is kept finite and sensible by rules a practitioner would apply anyway:

* tensor parallelism is a power of two inside the *fast domain* (one node, or one
  supernode where the cluster has one) unless ``max_tp`` says otherwise; 2-D splits
  ``tp_x x tp_y`` (both powers of two, ``tp >= 4``) for dense models;
* sequence parallelism is on whenever ``tp > 1`` (same bytes as the all-reduce, less
  activation memory), and ZeRO-1 replaces plain data parallelism (same bytes again);
* pipeline degrees are the divisors of the layer count that divide the devices left, and
  those of the layer count plus two that it does not divide, with the embedding and the
  loss counted as layers of the split (Megatron's ``account-for-embedding/loss``: Llama 3
  405B's 126 layers on 16 stages); virtual stages are the two smallest divisors ``>= 2`` of
  the layers (or slots) per stage;
* context parallelism is a power of two keeping >= ``min_cp_tokens`` tokens per rank;
  expert parallelism any divisor of the expert count that divides ``dp * cp`` or, with
  ``tp > 1``, ``tp * dp * cp`` (Megatron-Core's folding over the tensor-parallel ranks;
  ``Strategy`` says how each is laid out), and with
  ``ep > 1`` each MoE overlap variant of ``moe_overlaps`` (plain, Domino-EP, Comet with a
  few chunk and column-group counts) is tried (``plan.search`` keeps the fastest);
* micro-batch sizes are powers of two that divide the per-replica batch;
* memory settings are a grid of ZeRO stage by recompute, where recompute is extended by
  chunked loss (when a micro-batch holds at least two chunks), for svpp by a smaller
  memory cap (the midpoint to, and, the dependency floor ``v k`` below the builder's
  default; ``cost.pipeline`` charges their bubble) with no or full recompute, and, last,
  by activation swap with full recompute: all are explored only where the cheaper
  settings do not fit;
* precision is the user's (``dtype``): FP8 is never chosen silently.

What is left is filtered by ``Strategy.check`` (the one list of constraints).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import gcd

from legato.schedule.builders import default_memory_cap, memory_floor
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy, StrategyError

RECOMPUTE_LADDER = ("none", "selective", "full")
# (moe_overlap, moe_chunks, moe_groups): plain first, so ties keep the simplest
MOE_OVERLAPS = (
    ("none", 1, 1),
    ("domino", 2, 1),
    ("domino", 4, 1),
    ("comet", 2, 1),
    ("comet", 2, 2),
    ("comet", 4, 1),
    ("comet", 4, 2),
)


# What the search can enumerate; by default all but DualPipe, which the trainer does not
# run (gpipe and seq1f1b are dominated by 1f1b and svpp).
SEARCHED_SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-2p", "zb-v", "svpp", "dualpipe")
DEFAULT_SCHEDULES = SEARCHED_SCHEDULES[:-1]


@dataclass(frozen=True)
class SearchSpace:
    """Knobs of the enumeration; the defaults are what ``legato plan`` searches."""

    max_tp: int | None = None  # None: the fast domain (see fast_domain)
    two_d_tp: bool = True
    max_cp: int = 16
    min_cp_tokens: int = 1024
    max_mbs: int = 8
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    vpp_choices: int = 2  # how many virtual-stage counts to try per pipeline degree
    svpp_slices: tuple[int, ...] = (2, 4)
    zero_stages: tuple[int, ...] = (1, 2, 3)
    dtype: str = "bf16"
    prune_slow: bool = True  # skip memory settings that cannot make the top-k
    max_pp: int | None = None  # None: any divisor of the layers
    max_ep: int | None = None  # None: any divisor of the experts and dp * cp (tp * dp * cp)
    min_ep: int = 1  # > 1: MoE plans with expert parallelism only
    moe_overlaps: tuple[tuple[str, int, int], ...] = MOE_OVERLAPS
    loss_chunk: int = 4096  # tokens per loss chunk tried when memory is tight; 0: never
    swap: bool = True  # try activation swap (with full recompute) when nothing else fits
    svpp_caps: bool = True  # try smaller svpp memory caps when nothing cheaper fits

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_ep", "min_ep"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise StrategyError(f"{name}: must be an integer >= 1, got {value!r}")
        unknown = [name for name in self.schedules if name not in SEARCHED_SCHEDULES]
        if unknown or not self.schedules:
            raise StrategyError(
                f"schedules: each must be one of {', '.join(SEARCHED_SCHEDULES)}, got "
                f"{', '.join(self.schedules) or 'none'}"
            )


@dataclass(frozen=True)
class Shape:
    """The parallel degrees of one candidate (what the device count is factorised into)."""

    dp: int
    tp: int
    tp_y: int
    pp: int
    cp: int
    ep: int
    edges: bool = False  # the embedding and the loss count as layers of the pipeline split

    def slots(self, model: ModelSpec) -> int:
        """Layers of the pipeline split: the blocks, plus the embedding and loss as two."""
        return model.num_layers + 2 * self.edges


def fast_domain(cluster: ClusterSpec) -> int:
    """Devices inside the fastest domain that holds more than one link level's worth:
    a supernode where the cluster has one, else a node."""
    inner = cluster.levels[:-1] if len(cluster.levels) > 1 else cluster.levels
    return min(inner[-1].span, cluster.world_size)


def _powers_of_two(limit: int) -> list[int]:
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def shapes(model: ModelSpec, devices: int, space: SearchSpace, max_tp: int) -> Iterator[Shape]:
    """Every factorisation ``dp * cp * tp * pp = devices`` the rules above allow (before
    ``Strategy.check``)."""
    tps = [t for t in _powers_of_two(min(max_tp, devices)) if devices % t == 0]
    cps = [
        c
        for c in _powers_of_two(space.max_cp)
        if c == 1 or model.seq_len // c >= space.min_cp_tokens
    ]
    for tp in tps:
        splits = [1]
        if space.two_d_tp and model.moe is None and tp >= 4:
            splits += [y for y in _powers_of_two(tp // 2) if y >= 2]
        depths = [(pp, False) for pp in _divisors(model.num_layers)]
        depths += [(pp, True) for pp in _divisors(model.num_layers + 2) if model.num_layers % pp]
        for pp, edges in depths:
            if (devices // tp) % pp or pp > (space.max_pp or pp):
                continue
            for cp in cps:
                rest = devices // (tp * pp)
                if rest % cp:
                    continue
                dp = rest // cp
                eps = [1]
                if model.moe is not None:
                    experts = model.moe.num_experts
                    # dividing dp*cp, then (folded over the tp ranks) tp*dp*cp only
                    common = _divisors(gcd(experts, dp * cp))
                    common += [e for e in _divisors(gcd(experts, tp * dp * cp)) if (dp * cp) % e]
                    eps = [e for e in common if space.min_ep <= e <= (space.max_ep or e)]
                for tp_y in splits:
                    for ep in eps:
                        yield Shape(dp, tp, tp_y, pp, cp, ep, edges)


def _vpps(model: ModelSpec, shape: Shape, count: int) -> list[int]:
    per_stage = shape.slots(model) // shape.pp
    return [v for v in _divisors(per_stage) if v >= 2][:count]


def schedules(
    model: ModelSpec, shape: Shape, microbatches: int, space: SearchSpace
) -> Iterator[dict]:
    """Schedule options (``schedule``, ``vpp``, ``slices``) for one shape."""
    if shape.pp == 1:
        yield {"schedule": "1f1b"}
        return
    if microbatches < shape.pp:
        return
    names = space.schedules
    for name in ("1f1b", "zb-h1", "zb-2p"):
        if name in names:
            yield {"schedule": name}
    if "interleaved" in names and microbatches % shape.pp == 0:
        for v in _vpps(model, shape, space.vpp_choices):
            yield {"schedule": "interleaved", "vpp": v}
    if "zb-v" in names and (shape.slots(model) // shape.pp) % 2 == 0:
        yield {"schedule": "zb-v", "vpp": 2}
    even = shape.pp % 2 == 0 and microbatches % 2 == 0
    if "dualpipe" in names and even and microbatches >= 2 * shape.pp:
        yield {"schedule": "dualpipe"}
    if "svpp" in names:
        for v in [1, *_vpps(model, shape, 1)]:
            for k in space.svpp_slices:
                if model.seq_len % (k * shape.cp) == 0:
                    yield {"schedule": "svpp", "vpp": v, "slices": k}


def execution_options(
    model: ModelSpec, shape: Shape, gbs: int, space: SearchSpace
) -> Iterator[dict]:
    """(micro-batch size, schedule) options of a shape, smallest micro-batch first."""
    if gbs % shape.dp:
        return
    for mbs in _powers_of_two(space.max_mbs):
        if (gbs // shape.dp) % mbs:
            continue
        for sched in schedules(model, shape, gbs // (shape.dp * mbs), space):
            yield {"mbs": mbs, **sched}


def strategy_of(shape: Shape, options: dict, gbs: int, space: SearchSpace) -> Strategy:
    """The Strategy for a shape and one execution option, at the fastest memory setting
    (ZeRO-1 when there is data parallelism, no recompute)."""
    return Strategy(
        dp=shape.dp,
        tp=shape.tp,
        tp_y=shape.tp_y,
        pp=shape.pp,
        cp=shape.cp,
        ep=shape.ep,
        sp=shape.tp > 1,
        zero=1 if shape.dp * shape.cp > 1 else 0,
        gbs=gbs,
        dtype=space.dtype,
        embedding_stage=shape.edges,
        loss_stage=shape.edges,
        **options,
    )


def overlap_variants(model: ModelSpec, strategy: Strategy, space: SearchSpace) -> list[Strategy]:
    """``strategy`` under each MoE overlap variant of the space (itself alone when it has
    no expert parallelism)."""
    if model.moe is None or strategy.ep == 1:
        return [strategy]
    return [
        strategy.with_(moe_overlap=name, moe_chunks=chunks, moe_groups=groups)
        for name, chunks, groups in space.moe_overlaps
    ]


def smaller_caps(strategy: Strategy) -> list[int]:
    """SVPP memory caps below the builder's default, largest first: the midpoint to the
    dependency floor ``v k`` and the floor itself (none for other schedules)."""
    if strategy.schedule != "svpp" or strategy.pp == 1:
        return []
    v, k = strategy.vpp, strategy.slices
    floor, default = memory_floor(v, k), default_memory_cap(strategy.pp, v, k)
    return sorted({c for c in ((floor + default) // 2, floor) if c < default}, reverse=True)


def memory_settings(model: ModelSpec, strategy: Strategy, space: SearchSpace) -> list[dict]:
    """One row of the memory grid, in increasing memory saved and time spent: each
    recompute mode, followed by itself with chunked loss (same time, smaller logits) where
    a micro-batch holds at least two chunks, and last full recompute with chunked loss and
    activation swap (host copies hidden behind compute, up to the excess). No recompute
    and full recompute are also followed by each smaller SVPP memory cap (less activation
    memory, more bubble): a cap trades against recompute, so its cells are *extras* that
    :func:`legato.plan.search.search` scores without ending the row."""
    tokens = strategy.mbs * model.seq_len // strategy.cp
    chunk = space.loss_chunk if 0 < 2 * space.loss_chunk <= tokens else 0
    row = []
    caps = smaller_caps(strategy) if space.svpp_caps else []
    for recompute in RECOMPUTE_LADDER:
        row.append({"recompute": recompute})
        if chunk and recompute != "selective":
            row.append({"recompute": recompute, "loss_chunk": chunk})
        if recompute != "selective":
            row += [{"recompute": recompute, "loss_chunk": chunk, "memory_cap": c} for c in caps]
    if space.swap:
        row.append({"recompute": "full", "loss_chunk": chunk, "swap": True})
    return row


def memory_ladder(
    model: ModelSpec, strategy: Strategy, space: SearchSpace
) -> list[Sequence[Strategy]]:
    """Memory settings of ``strategy`` as rows of increasing ZeRO stage, each row the
    settings of :func:`memory_settings`. Within the grid, moving right or down saves
    memory and never saves time, which :func:`legato.plan.search.search` uses to stop
    early."""
    stages = [z for z in space.zero_stages if z >= strategy.zero] if strategy.zero else [0]
    row = memory_settings(model, strategy, space)
    return [_LadderRow(strategy, z, row) for z in stages]


class _LadderRow(Sequence[Strategy]):
    """One ZeRO stage's memory settings, each Strategy built only when the search reaches
    it: most grids are left after their first cell, and building (validating) a
    Strategy is a good share of what the search costs."""

    def __init__(self, base: Strategy, zero: int, settings: list[dict]) -> None:
        self.base, self.zero, self.settings = base, zero, settings

    def __len__(self) -> int:
        return len(self.settings)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.base.with_(zero=self.zero, **self.settings[index])


def is_valid(strategy: Strategy, model: ModelSpec, devices: int) -> str | None:
    """None if ``strategy`` satisfies every constraint, else the violated one."""
    try:
        strategy.check(model, devices)
    except StrategyError as exc:
        return str(exc)
    return None
