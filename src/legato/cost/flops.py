"""Matmul FLOPs of a ModelSpec's forward and training step, counted exactly.

A matmul of [m, k] by [k, n] is 2*m*n*k FLOPs, as ``torch.utils.flop_counter`` counts it.
Only matmuls are counted: norms, softmax, activations, residual adds and bias adds are
elementwise (well under 1% of the total for real models) and embedding lookups are
gathers with no FLOPs. The weights multiplied are exactly those of ``specs.params``
(without biases), so ``2 * tokens * weights`` is the projection and MLP cost.

Attention scores (QK^T) and values (AV) cost ``2 * heads * pairs * (qk_dim + v_dim)``
per sequence, where ``pairs`` is ``S*(S+1)/2`` for causal attention (the unmasked half,
diagonal included: what a causal kernel computes) or ``S*S`` with ``causal=False`` (what
``FlopCounterMode`` counts for SDPA, and what Megatron-LM's formula assumes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cache

from legato.specs.model import ModelSpec
from legato.specs.params import attention_params, mlp_params


@dataclass(frozen=True)
class FlopBreakdown:
    """Forward FLOPs by part; ``total`` is their sum."""

    attention_proj: int = 0  # Q, K, V projections (MLA: q_a, q_b, kv_a, kv_b)
    attention_scores: int = 0  # QK^T and AV
    attention_out: int = 0  # output projection
    mlp: int = 0  # dense MLP layers
    moe_experts: int = 0  # top_k routed experts per token, plus the shared experts
    router: int = 0
    lm_head: int = 0
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(self.parts().values()))

    def parts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def __add__(self, other: FlopBreakdown) -> FlopBreakdown:
        theirs = other.parts()
        return FlopBreakdown(**{name: n + theirs[name] for name, n in self.parts().items()})

    def __mul__(self, times: int) -> FlopBreakdown:
        return FlopBreakdown(**{name: n * times for name, n in self.parts().items()})


def _attention_pairs(seq_len: int, causal: bool) -> int:
    return seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len


def layer_forward_flops(
    spec: ModelSpec, layer: int, batch: int, seq_len: int, *, causal: bool = True
) -> FlopBreakdown:
    """Forward FLOPs of transformer block ``layer`` on ``batch`` sequences of ``seq_len``."""
    return _block_flops(spec, spec.is_moe_layer(layer), batch, seq_len, causal)


def _block_flops(
    spec: ModelSpec, is_moe: bool, batch: int, seq_len: int, causal: bool
) -> FlopBreakdown:
    weights = replace(spec, bias=False)  # matmul weights are the bias-free parameters
    tokens = batch * seq_len
    h, heads = spec.hidden_size, spec.num_heads
    if spec.mla is None:
        qk_dim = v_dim = spec.head_dim
    else:
        qk_dim = spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim
        v_dim = spec.mla.v_head_dim
    out_weights = heads * v_dim * h
    in_weights = attention_params(weights)[0] - out_weights
    pairs = batch * heads * _attention_pairs(seq_len, causal)
    parts = {
        "attention_proj": 2 * tokens * in_weights,
        "attention_scores": 2 * pairs * (qk_dim + v_dim),
        "attention_out": 2 * tokens * out_weights,
    }
    moe = spec.moe
    if is_moe:
        per_token = moe.top_k * mlp_params(weights, moe.expert_ffn_hidden_size)
        per_token += moe.num_shared_experts * mlp_params(weights, moe.shared_expert_ffn_hidden_size)
        parts["moe_experts"] = 2 * tokens * per_token
        parts["router"] = 2 * tokens * h * moe.num_experts
    else:
        parts["mlp"] = 2 * tokens * mlp_params(weights, spec.ffn_hidden_size)
    return FlopBreakdown(**parts)


@cache  # the planner asks for the same few shapes for thousands of candidates
def forward_flops(
    spec: ModelSpec, batch: int, seq_len: int, *, causal: bool = True
) -> FlopBreakdown:
    """Forward FLOPs of the whole model, logits included (tied or not)."""
    total = FlopBreakdown(lm_head=2 * batch * seq_len * spec.hidden_size * spec.vocab_size)
    n_moe = spec.num_moe_layers
    if n_moe:
        total += _block_flops(spec, True, batch, seq_len, causal) * n_moe
    if n_moe < spec.num_layers:
        total += _block_flops(spec, False, batch, seq_len, causal) * (spec.num_layers - n_moe)
    return total


def training_flops_per_token(
    spec: ModelSpec, seq_len: int | None = None, *, causal: bool = True
) -> float:
    """Model FLOPs of one training token (the MFU numerator): forward plus backward, which
    costs twice the forward (gradients of activations and of weights). Recompute is not
    counted. Equals the familiar ``6 N + attention`` with N the active matmul weights."""
    seq_len = seq_len or spec.seq_len
    return 3 * forward_flops(spec, 1, seq_len, causal=causal).total / seq_len


def recompute_flops(
    spec: ModelSpec, batch: int, seq_len: int, recompute: str, *, causal: bool = True
) -> int:
    """FLOPs recomputation adds to a training step: full recompute reruns the forward of
    every block (not the LM head); selective recompute reruns attention's QK^T and AV."""
    if recompute == "none":
        return 0
    fwd = forward_flops(spec, batch, seq_len, causal=causal)
    if recompute == "full":
        return fwd.total - fwd.lm_head
    return fwd.attention_scores


def training_step_flops(
    spec: ModelSpec, batch: int, seq_len: int, recompute: str = "none", *, causal: bool = True
) -> int:
    """FLOPs of one training step on ``batch`` sequences: three forward passes' worth
    (forward, input and weight gradients) plus recompute. With ``recompute="none"`` and
    ``causal=True`` these are model FLOPs (the MFU numerator); otherwise the FLOPs the
    kernels execute (HFU)."""
    fwd = forward_flops(spec, batch, seq_len, causal=causal).total
    return 3 * fwd + recompute_flops(spec, batch, seq_len, recompute, causal=causal)
