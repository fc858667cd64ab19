"""Cost model: FLOPs, memory, collectives and compute efficiency. Pure Python, no torch."""

from legato.cost.flops import (
    FlopBreakdown,
    forward_flops,
    layer_forward_flops,
    training_flops_per_token,
)

__all__ = ["FlopBreakdown", "forward_flops", "layer_forward_flops", "training_flops_per_token"]
