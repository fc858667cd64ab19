"""The parallel search space: factorisations of the device count and, for each, the
execution and memory options worth scoring.

The space is kept finite and sensible by rules a practitioner would apply anyway:

* tensor parallelism is a power of two inside the *fast domain* (one node, or one
  supernode where the cluster has one) unless ``max_tp`` says otherwise; 2-D splits
  ``tp_x x tp_y`` (both powers of two, ``tp >= 4``) for dense models;
* sequence parallelism is on whenever ``tp > 1`` (same bytes as the all-reduce, less
  activation memory), and ZeRO-1 replaces plain data parallelism (same bytes again);
* pipeline degrees are the divisors of the layer count that divide the devices left;
  virtual stages are the two smallest divisors ``>= 2`` of the layers per stage;
* context and expert parallelism are powers of two (``cp`` keeps >= ``min_cp_tokens``
  tokens per rank; ``ep`` divides the expert count and ``dp * cp``);
* micro-batch sizes are powers of two that divide the per-replica batch.

What is left is filtered by ``Strategy.check`` (the one list of constraints).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy, StrategyError

RECOMPUTE_LADDER = ("none", "selective", "full")


@dataclass(frozen=True)
class SearchSpace:
    """Knobs of the enumeration; the defaults are what ``legato plan`` searches."""

    max_tp: int | None = None  # None: the fast domain (see fast_domain)
    two_d_tp: bool = True
    max_cp: int = 16
    min_cp_tokens: int = 1024
    max_mbs: int = 8
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "zb-h1", "zb-v", "svpp")
    vpp_choices: int = 2  # how many virtual-stage counts to try per pipeline degree
    svpp_slices: tuple[int, ...] = (2, 4)
    zero_stages: tuple[int, ...] = (1, 2, 3)
    dtype: str = "bf16"
    prune_slow: bool = True  # skip memory settings that cannot make the top-k


@dataclass(frozen=True)
class Shape:
    """The parallel degrees of one candidate (what the device count is factorised into)."""

    dp: int
    tp: int
    tp_y: int
    pp: int
    cp: int
    ep: int


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
        for pp in _divisors(model.num_layers):
            if (devices // tp) % pp:
                continue
            for cp in cps:
                rest = devices // (tp * pp)
                if rest % cp:
                    continue
                dp = rest // cp
                eps = [1]
                if model.moe is not None:
                    eps = [e for e in _powers_of_two(dp * cp) if model.moe.num_experts % e == 0]
                for tp_y in splits:
                    for ep in eps:
                        yield Shape(dp, tp, tp_y, pp, cp, ep)


def _vpps(model: ModelSpec, pp: int, count: int) -> list[int]:
    per_stage = model.num_layers // pp
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
    for name in ("1f1b", "zb-h1"):
        if name in names:
            yield {"schedule": name}
    if "interleaved" in names and microbatches % shape.pp == 0:
        for v in _vpps(model, shape.pp, space.vpp_choices):
            yield {"schedule": "interleaved", "vpp": v}
    if "zb-v" in names and (model.num_layers // shape.pp) % 2 == 0:
        yield {"schedule": "zb-v", "vpp": 2}
    if "svpp" in names:
        for v in [1, *_vpps(model, shape.pp, 1)]:
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
        **options,
    )


def memory_ladder(strategy: Strategy, space: SearchSpace) -> list[list[Strategy]]:
    """Memory settings of ``strategy`` as rows of increasing ZeRO stage, each row in
    increasing recompute. Within the grid, moving right or down saves memory and never
    saves time, which :func:`legato.plan.search.search` uses to stop early."""
    stages = [z for z in space.zero_stages if z >= strategy.zero] if strategy.zero else [0]
    return [[strategy.with_(zero=z, recompute=r) for r in RECOMPUTE_LADDER] for z in stages]


def is_valid(strategy: Strategy, model: ModelSpec, devices: int) -> str | None:
    """None if ``strategy`` satisfies every constraint, else the violated one."""
    try:
        strategy.check(model, devices)
    except StrategyError as exc:
        return str(exc)
    return None
