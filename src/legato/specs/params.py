"""Exact parameter count of a ModelSpec, tensor by tensor.

The count must equal what the reference model (``legato.models``) holds, so the layout is
spelled out here once (Hugging Face Llama / Mixtral / Qwen3 / DeepSeek-V3 naming):

* ``embed_tokens [V, h]``; ``position="learned"`` adds ``[seq_len, h]``.
* Per layer: ``input_layernorm [h]``, ``post_attention_layernorm [h]``; attention
  ``q_proj [heads*d, h]``, ``k_proj``/``v_proj [kv*d, h]``, ``o_proj [h, heads*d]``;
  ``qk_norm`` adds ``q_norm``/``k_norm [d]`` (d = head_dim); ``qkv_bias`` (Qwen2) adds
  biases ``[heads*d]``, ``[kv*d]``, ``[kv*d]`` to q/k/v only.
* MLP: swiglu ``gate_proj``/``up_proj [ffn, h]`` + ``down_proj [h, ffn]``; gelu has only
  the up and down matrices.
* MoE layer: router ``gate [E, h]`` (never a bias), E routed experts of
  ``expert_ffn_hidden_size`` and ``num_shared_experts`` shared experts of
  ``shared_expert_ffn_hidden_size``, each an MLP of the kind above; the shared experts are
  stored together as one MLP of width ``num_shared_experts * shared_expert_ffn_hidden_size``
  (DeepSeek layout), which matters only for biases. The sigmoid router's
  per-expert load-balancing bias is a buffer, not a parameter, so it is not counted.
* MLA (``spec.mla``): ``q_a_proj [q_lora, h]``, ``q_a_layernorm [q_lora]``,
  ``q_b_proj [heads*(nope+rope), q_lora]`` (or ``q_proj [heads*(nope+rope), h]`` when
  ``q_lora_rank`` is None), ``kv_a_proj_with_mqa [kv_lora+rope, h]``,
  ``kv_a_layernorm [kv_lora]``, ``kv_b_proj [heads*(nope+v), kv_lora]``,
  ``o_proj [h, heads*v]``.
* Final ``norm [h]``; ``lm_head [V, h]`` unless ``tied_embeddings``.
* ``bias=True`` (GPT style) adds a bias to every linear layer (attention, MLP, experts,
  MLA projections) except the router and ``lm_head``. ``norm="layernorm"`` gives every
  norm (including qk and MLA latent norms) a weight and a bias; RMSNorm has a weight only.
* DeepSeek-V3's published 671B excludes its multi-token-prediction module; so do we.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.specs.model import ModelSpec


@dataclass(frozen=True)
class ParamCount:
    """Parameters of a model by part. ``total`` is their sum; ``active`` is what one token
    uses: ``top_k`` routed experts instead of all of them, everything else in full."""

    embedding: int
    position_embedding: int
    attention: int  # projections (and their biases) of every layer
    mlp: int  # dense MLP layers
    experts: int  # routed experts of every MoE layer
    shared_experts: int
    router: int
    norms: int  # layer norms, final norm, qk norms, MLA latent norms
    lm_head: int
    total: int
    active: int


def _linear(spec: ModelSpec, n_in: int, n_out: int) -> int:
    return n_in * n_out + (n_out if spec.bias else 0)


def _norm(spec: ModelSpec, dim: int) -> int:
    return 2 * dim if spec.norm == "layernorm" else dim


def mlp_params(spec: ModelSpec, ffn_hidden_size: int) -> int:
    """One MLP (dense, routed expert or shared expert) of the given hidden width."""
    h = spec.hidden_size
    n_in = 2 if spec.mlp == "swiglu" else 1  # gate+up, or up only
    return n_in * _linear(spec, h, ffn_hidden_size) + _linear(spec, ffn_hidden_size, h)


def attention_params(spec: ModelSpec) -> tuple[int, int]:
    """(projections, norms inside attention) of one layer."""
    h, heads = spec.hidden_size, spec.num_heads
    mla = spec.mla
    if mla is None:
        q, kv = heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        proj = _linear(spec, h, q) + 2 * _linear(spec, h, kv) + _linear(spec, q, h)
        if spec.qkv_bias and not spec.bias:
            proj += q + 2 * kv
        return proj, 2 * _norm(spec, spec.head_dim) if spec.qk_norm else 0
    qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank is None:
        q_proj, norms = _linear(spec, h, heads * qk_head), 0
    else:
        q_proj = _linear(spec, h, mla.q_lora_rank) + _linear(spec, mla.q_lora_rank, heads * qk_head)
        norms = _norm(spec, mla.q_lora_rank)
    kv_proj = _linear(spec, h, mla.kv_lora_rank + mla.qk_rope_head_dim) + _linear(
        spec, mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    )
    o_proj = _linear(spec, heads * mla.v_head_dim, h)
    norms += _norm(spec, mla.kv_lora_rank)
    if spec.qk_norm:
        norms += 2 * _norm(spec, qk_head)
    return q_proj + kv_proj + o_proj, norms


def _layer_parts(spec: ModelSpec, layer: int) -> dict[str, int]:
    proj, attn_norms = attention_params(spec)
    parts = {"attention": proj, "norms": attn_norms + 2 * _norm(spec, spec.hidden_size)}
    moe = spec.moe
    if spec.is_moe_layer(layer):
        parts["router"] = moe.num_experts * spec.hidden_size
        parts["experts"] = moe.num_experts * mlp_params(spec, moe.expert_ffn_hidden_size)
        # Shared experts are stored as one MLP of the summed width (DeepSeek layout).
        shared_width = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        parts["shared_experts"] = mlp_params(spec, shared_width) if shared_width else 0
    else:
        parts["mlp"] = mlp_params(spec, spec.ffn_hidden_size)
    return parts


def layer_params(spec: ModelSpec, layer: int) -> int:
    """Parameters held by transformer block ``layer`` (for balancing pipeline stages)."""
    return sum(_layer_parts(spec, layer).values())


def count_params(spec: ModelSpec) -> ParamCount:
    """Exact parameter count of ``spec`` by part (see the module docstring for the layout)."""
    h, vocab = spec.hidden_size, spec.vocab_size
    totals = {
        "attention": 0,
        "mlp": 0,
        "experts": 0,
        "shared_experts": 0,
        "router": 0,
        "norms": _norm(spec, h),
    }
    for layer in range(spec.num_layers):
        for part, n in _layer_parts(spec, layer).items():
            totals[part] += n
    parts = {
        "embedding": vocab * h,
        "position_embedding": spec.seq_len * h if spec.position == "learned" else 0,
        "lm_head": 0 if spec.tied_embeddings else vocab * h,
        **totals,
    }
    total = sum(parts.values())
    idle_experts = 0
    if spec.moe is not None:
        per_expert = mlp_params(spec, spec.moe.expert_ffn_hidden_size)
        idle_experts = spec.num_moe_layers * (spec.moe.num_experts - spec.moe.top_k) * per_expert
    return ParamCount(**parts, total=total, active=total - idle_experts)
