"""Placement rules: for each role a mesh axis can play, the SBP signature of every op kind.

A signature is ``(inputs, weights, outputs)``, each a space-separated list of placements
applied to the op's tensors in order (the last one repeats). An axis's placements do not
depend on the other axes, so an n-D layout is the product of its axes' roles (SBP on an
n-D mesh is one placement per axis).

Roles:

* ``dp`` / ``edp``: batch split (S(0)), weights replicated; ``edp`` is the data axis of
  an MoE layer's expert view (``dp * cp / ep`` ranks).
* ``cp``: sequence split (S(1)); the attention core needs all keys and values (B): an
  all-gather, run as a ring of P2P steps overlapping the attention blocks (same bytes).
* ``tp``: Megatron 1-D tensor parallelism: column-parallel Q/K/V and MLP up (weight
  S(0), output S(2)), row-parallel output and down projections (weight S(1), output P,
  all-reduced at the residual), vocab-parallel embedding and LM head + loss.
* ``tp_sp``: ``tp`` plus sequence parallelism: the residual stream, norms and dropout are
  sequence-split (S(1)), so the all-reduce becomes reduce-scatter + all-gather.
* ``tp_x`` / ``tp_y``: the 2-D weight-stationary layout of Hypertron (SC'25; docs/planner.md). ``tp_y``
  is ``tp_sp``. ``tp_x`` is the transposed pattern: the residual stream is hidden-split
  (S(2)), Q/K/V and MLP up are row-parallel (weight S(1) in torch's [out, in], output P,
  reduce-scattered over the sequence), the attention core takes sequence-split queries
  and all-reduced keys/values, and the output/down projections are column-parallel after
  an all-gather, which returns the input layout. In the note's math form (``X W``) the MLP
  is W1 = (S(0) on x, S(1) on y), W2 = (S(1) on x, S(0) on y).
* ``ep``: expert parallelism: tokens are routed into ``[experts, capacity, h]`` buffers
  split by source (S(1)); the experts need them split by expert (S(0)): all-to-all; the
  combine moves them back.
* ``tp_moe`` / ``tp_sp_moe`` (expert tensor parallelism 1: experts replicated over the tp
  ranks, which act as data parallel for them) and ``tp_etp`` / ``tp_sp_etp`` (expert TP =
  tp: experts column/row parallel like the MLP): the tp axis in an MoE layer's expert view.
"""

from __future__ import annotations

from legato.layout.errors import LayoutError
from legato.layout.placements import Placement, placement

Signature = tuple[str, str, str]

_DP: dict[str, Signature] = {"*": ("S(0)", "B", "S(0)")}
_EDP: dict[str, Signature] = {
    "*": ("S(0)", "B", "S(0)"),
    "dispatch": ("S(0)", "", "S(1)"),
    "experts_up": ("S(1)", "B", "S(1)"),
    "experts_act": ("S(1)", "", "S(1)"),
    "experts_down": ("S(1)", "B", "S(1)"),
    "combine": ("S(1) S(0)", "", "S(0)"),
}
_CP: dict[str, Signature] = {"*": ("S(1)", "B", "S(1)"), "attn_core": ("S(1) B B", "", "S(1)")}
_EP: dict[str, Signature] = {
    **_EDP,
    "experts_up": ("S(0)", "S(0)", "S(0)"),
    "experts_act": ("S(0)", "", "S(0)"),
    "experts_down": ("S(0)", "S(0)", "S(0)"),
}
_TP: dict[str, Signature] = {
    "*": ("B", "B", "B"),
    "qkv": ("B", "S(0)", "S(2)"),
    "attn_core": ("S(2)", "", "S(2)"),
    "o_proj": ("S(2)", "S(1)", "P"),
    "mlp_up": ("B", "S(0)", "S(2)"),
    "mlp_act": ("S(2)", "", "S(2)"),
    "mlp_down": ("S(2)", "S(1)", "P"),
    "embedding": ("B", "S(0)", "P"),
    "lm_head": ("B", "S(0)", "S(2)"),
    "loss.stats": ("S(2)", "", "P"),
}
_SEQ = {  # what sequence parallelism changes: the residual stream is sequence-split
    "norm.stats": ("S(1)", "", "S(1)"),
    "norm": ("S(1)", "B", "S(1)"),
    "residual": ("S(1)", "", "S(1)"),
}
_TP_SP = {**_TP, **_SEQ}
_TP_X: dict[str, Signature] = {  # dense layers only
    "norm.stats": ("S(2)", "", "P"),
    "norm": ("S(2) B", "S(0)", "S(2)"),
    "qkv": ("S(2)", "S(1)", "P"),
    "attn_core": ("S(1) B B", "", "S(1)"),
    "o_proj": ("B", "S(0)", "S(2)"),
    "residual": ("S(2)", "", "S(2)"),
    "mlp_up": ("S(2)", "S(1)", "P"),
    "mlp_act": ("S(1)", "", "S(1)"),
    "mlp_down": ("B", "S(0)", "S(2)"),
    "embedding": ("B", "S(1)", "S(2)"),
    "lm_head": ("S(2)", "S(1)", "P"),
    "loss.stats": ("S(1)", "", "S(1)"),
    "loss": ("S(1)", "", "S(1)"),
}
_EXPERTS_REPLICATED = {  # expert TP 1: the tp ranks are data parallel for the experts
    "router": ("B", "B", "B"),
    "dispatch": ("B", "", "B"),
    "experts_up": ("B", "B", "B"),
    "experts_act": ("B", "", "B"),
    "experts_down": ("B", "B", "B"),
    "combine": ("B", "", "B"),
}
_EXPERTS_SPLIT = {  # expert TP = tp: column/row parallel experts on all tokens
    "router": ("B", "B", "B"),
    "dispatch": ("B", "", "B"),
    "experts_up": ("B", "S(1)", "S(2)"),
    "experts_act": ("S(2)", "", "S(2)"),
    "experts_down": ("S(2)", "S(2)", "P"),
    "combine": ("P B", "", "P"),
}
_SEQ_EXPERTS = {  # sequence-split tokens route locally
    "router": ("S(1)", "B", "S(1)"),
    "dispatch": ("S(1)", "", "S(1)"),
    "experts_up": ("S(1)", "B", "S(1)"),
    "experts_act": ("S(1)", "", "S(1)"),
    "experts_down": ("S(1)", "B", "S(1)"),
    "combine": ("S(1)", "", "S(1)"),
}

ROLES: dict[str, dict[str, Signature]] = {
    "dp": _DP,
    "edp": _EDP,
    "cp": _CP,
    "ep": _EP,
    "tp": _TP,
    "tp_sp": _TP_SP,
    "tp_x": _TP_X,
    "tp_y": _TP_SP,
    "tp_moe": {**_TP, **_EXPERTS_REPLICATED},
    "tp_sp_moe": {**_TP_SP, **_SEQ_EXPERTS},
    "tp_etp": {**_TP, **_EXPERTS_SPLIT},
    "tp_sp_etp": {**_TP_SP, **_EXPERTS_SPLIT, "router": ("S(1)", "B", "S(1)")},
}


def _expand(text: str, count: int) -> tuple[Placement, ...]:
    items = [placement(t) for t in text.split()]
    if count and not items:
        raise LayoutError(f"placement rule {text!r} is empty for {count} tensors")
    return tuple(items[min(i, len(items) - 1)] for i in range(count))


def signature(
    role: str, kind: str, n_in: int, n_w: int, n_out: int
) -> tuple[tuple[Placement, ...], tuple[Placement, ...], tuple[Placement, ...]]:
    """Placements of an op's inputs, weights and outputs on an axis playing ``role``."""
    if role not in ROLES:
        raise LayoutError(f"unknown mesh-axis role {role!r}; known: {', '.join(ROLES)}")
    table = ROLES[role]
    rule = table.get(kind) or table.get("*")
    if rule is None:
        raise LayoutError(f"role {role!r} has no placement rule for {kind!r} ops")
    ins, ws, outs = rule
    return _expand(ins, n_in), _expand(ws, n_w), _expand(outs, n_out)
