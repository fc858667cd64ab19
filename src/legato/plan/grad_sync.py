"""Weight and gradient collectives of a layout: what the data-parallel axes and ZeRO add.

A weight's *data axes* are the axes where it is replicated while the op's input is split
(``dp``, ``cp``, ``edp``; also ``tp`` for norm weights under sequence parallelism and for
experts with expert-TP 1): every rank there computes a partial gradient. Its gradient
goes ``P -> S(0)`` (reduce-scatter) and the updated weight ``S(0) -> B`` (all-gather),
which is a ring all-reduce split in its two halves (ZeRO 0 does exactly that volume).
ZeRO stages differ in *when*:

* 0 and 1: both once per step (ZeRO-1 shards only the optimizer state);
* 2: gradients are kept sharded, so each micro-batch's backward reduce-scatters them;
  the weight all-gather stays once per step;
* 3 (FSDP): weights are stored sharded, so every micro-batch all-gathers them before the
  forward and again before the backward, and reduce-scatters the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from legato.layout.placements import PARTIAL, REPLICATE, Collective, Shard, redistribute_cost
from legato.layout.sbp_layout import PartLayout


@dataclass(frozen=True)
class WeightCollectives:
    per_microbatch: list[Collective] = field(default_factory=list)
    per_step: list[Collective] = field(default_factory=list)


def weight_collectives(layout: PartLayout) -> WeightCollectives:
    """Weight and gradient collectives of ``layout`` under its strategy's ZeRO stage."""
    zero = layout.strategy.zero
    param_bytes = 4 if layout.strategy.dtype == "fp32" else 2
    out = WeightCollectives()
    seen: set[str] = set()
    for segment in layout.segments:
        sizes = segment.axis_sizes
        for placed in segment.ops:
            first_input = placed.inputs[0][1] if placed.inputs else {}
            for name, where in placed.weights:
                numel = layout.sizes.weight_numel[name]
                if name in seen or numel == 0:
                    continue
                seen.add(name)
                data = [
                    axis
                    for axis, p in where.items()
                    if p == REPLICATE and isinstance(first_input.get(axis), Shard)
                ]
                if not data:
                    continue
                nbytes = numel * param_bytes
                sharded = {**where, **{a: Shard(0) for a in data}}
                partial = {**where, **{a: PARTIAL for a in data}}
                gather = redistribute_cost(nbytes, sharded, where, sizes, name)
                reduce = redistribute_cost(nbytes, partial, sharded, sizes, name)
                if zero == 3:
                    out.per_microbatch.extend(gather + gather + reduce)
                elif zero == 2:
                    out.per_microbatch.extend(reduce)
                    out.per_step.extend(gather)
                else:
                    out.per_step.extend(reduce + gather)
    return out
