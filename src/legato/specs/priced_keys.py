"""The strategy keys the cost model prices, as data: what turns each on.

One table, in the lowest layer (no torch), read by every level that must agree on it: the
tests (``tests/distributed/test_strategies.py`` trains
every example on every model family it applies to and compares with one process;
``tests/parallel/test_priced_keys.py`` resolves every pair of examples), and a check that
every field of ``Strategy`` has its row, so a key the planner learns to price is a key the
runtime and its tests see.

``examples``: strategy strings that turn the key on over 2 processes (4 for ``tp=2x2``),
with no other key than those the example needs; values the runtime runs alike (zb-2p
as zb-h1, 1f1b as gpipe) are left to one of them. ``needs_moe``: the key only means
something on an MoE model. ``legato train`` runs every value of every key but
``schedule=dualpipe`` (two model copies; priced and simulated, refused in one line); what
it refuses are combinations (``parallel.job``), each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PricedKey:
    key: str
    examples: tuple[str, ...]
    needs_moe: bool = False


PRICED_KEYS: tuple[PricedKey, ...] = (
    PricedKey("dp", ("dp=2",)),
    PricedKey("zero", ("dp=2,zero=0", "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3")),
    PricedKey("tp", ("tp=2",)),
    PricedKey("sp", ("tp=2,sp=1",)),
    PricedKey("tp_y", ("tp=2x2",)),
    PricedKey("cp", ("cp=2",)),
    PricedKey("pp", ("pp=2",)),
    PricedKey(
        "schedule",
        ("pp=2,schedule=gpipe", "pp=2,schedule=zb-h1", "pp=2,schedule=zb-v"),
    ),
    PricedKey("vpp", ("pp=2,schedule=interleaved,vpp=2",)),
    PricedKey("slices", ("pp=2,schedule=seq1f1b,slices=2",)),
    PricedKey("memory_cap", ("pp=2,schedule=svpp,slices=2,memory_cap=4",)),
    # Megatron-LM's uneven splits (4 blocks: 1|3, 3|1, embedding+2|2, 2|1|1|loss)
    PricedKey("first_stage_layers", ("pp=2,first_stage_layers=1",)),
    PricedKey("last_stage_layers", ("pp=2,last_stage_layers=1",)),
    PricedKey("embedding_stage", ("pp=2,embedding_stage=1",)),
    PricedKey("loss_stage", ("pp=2,schedule=interleaved,vpp=2,loss_stage=1",)),
    # folded over the tp ranks (ep = dp*cp*tp, Megatron-Core's parallel folding) as well
    PricedKey("ep", ("ep=2", "tp=2,sp=1,ep=2"), needs_moe=True),
    PricedKey("moe_overlap", ("ep=2,moe_overlap=domino,moe_chunks=2",), needs_moe=True),
    PricedKey("moe_chunks", ("ep=2,moe_overlap=comet,moe_chunks=2",), needs_moe=True),
    PricedKey("moe_groups", ("ep=2,moe_overlap=comet,moe_chunks=2,moe_groups=2",), needs_moe=True),
    PricedKey("etp", ("tp=2,etp=2", "tp=2,sp=1,etp=2"), needs_moe=True),
    PricedKey("recompute", ("recompute=selective", "recompute=full")),
    PricedKey("swap", ("swap=1",)),
    PricedKey("loss_chunk", ("loss_chunk=32",)),
    PricedKey("dtype", ("dtype=bf16", "dtype=fp16", "dtype=fp8")),
    PricedKey("mbs", ("mbs=2",)),
    PricedKey("gbs", ("gbs=8",)),
)
KEYS: dict[str, PricedKey] = {row.key: row for row in PRICED_KEYS}
