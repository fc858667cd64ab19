"""Dropless mixture-of-experts: router, grouped expert GEMMs, expert parallelism and
Comet-style chunked communication/computation overlap (see ``docs/moe.md``). Sharding the
experts over ranks is the runtime's (``legato.parallel.expert``)."""

from legato.moe.chunked_overlap import Overlap, routed_experts
from legato.moe.comm import EPGroup
from legato.moe.experts import GroupedExperts
from legato.moe.grouped_gemm import grouped_mm, grouped_mm_supported
from legato.moe.layer import MoELayer, moe_layers
from legato.moe.load import LoadStats, end_step
from legato.moe.router import Router, Routing, load_balance_loss, router_z_loss

__all__ = [
    "EPGroup",
    "GroupedExperts",
    "LoadStats",
    "MoELayer",
    "Overlap",
    "Router",
    "Routing",
    "end_step",
    "grouped_mm",
    "grouped_mm_supported",
    "load_balance_loss",
    "moe_layers",
    "routed_experts",
    "router_z_loss",
]
