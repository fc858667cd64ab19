"""Multi-head latent attention (DeepSeek-V2/V3) with DeepSeek's Hugging Face names.

Q is optionally low-rank (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``, or a full
``q_proj``); K/V share one compressed latent (``kv_a_proj_with_mqa`` -> ``kv_a_layernorm`` ->
``kv_b_proj``) plus a single rotary key part shared by all heads. This reference
decompresses K/V per head and runs ordinary SDPA; RoPE touches only the rotary part, in
DeepSeek-V3's interleaved layout. ``qk_norm`` (not in DeepSeek) normalises each full
query/key head before RoPE, as Qwen3 does for ordinary attention.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from legato.models.forward_context import ForwardContext, Rope
from legato.models.norms import build_norm
from legato.models.rope import apply_rope
from legato.specs.model import ModelSpec


class MLAttention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_index: int = 0) -> None:
        super().__init__()
        mla = spec.mla
        assert mla is not None
        h, heads, bias = spec.hidden_size, spec.num_heads, spec.bias
        self.layer_index = layer_index
        self.sliding_window = spec.sliding_window
        self.num_heads = heads
        self.recompute_core = False  # set by parallel.recompute (selective)
        self.nope_dim = mla.qk_nope_head_dim
        self.rope_dim = mla.qk_rope_head_dim
        self.v_dim = mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        qk_dim = self.nope_dim + self.rope_dim
        self.low_rank_q = mla.q_lora_rank is not None
        if not self.low_rank_q:
            self.q_proj = nn.Linear(h, heads * qk_dim, bias=bias)
        else:
            self.q_a_proj = nn.Linear(h, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = build_norm(spec.norm, mla.q_lora_rank, spec.norm_eps)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, heads * qk_dim, bias=bias)
        self.kv_a_proj_with_mqa = nn.Linear(h, mla.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = build_norm(spec.norm, mla.kv_lora_rank, spec.norm_eps)
        self.kv_b_proj = nn.Linear(
            mla.kv_lora_rank, heads * (self.nope_dim + self.v_dim), bias=bias
        )
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=bias)
        if spec.qk_norm:
            self.q_norm = build_norm(spec.norm, qk_dim, spec.norm_eps)
            self.k_norm = build_norm(spec.norm, qk_dim, spec.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _query(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        if self.low_rank_q:
            return ctx.linear(self.q_b_proj, self.q_a_layernorm(ctx.linear(self.q_a_proj, x)))
        return ctx.linear(self.q_proj, x)

    def _rotate_tail(self, x: Tensor, rope: Rope) -> Tensor:
        """RoPE on the last ``rope_dim`` features of each head, the rest untouched."""
        nope, rot = x.split((self.nope_dim, self.rope_dim), dim=-1)
        return torch.cat((nope, apply_rope(rot, *rope, interleaved=True)), dim=-1)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """``x`` [..., S, h] -> [..., S, h]; q/k/v reach the backend as [..., H, S, D]."""
        assert ctx.rope is not None, "MLA needs rotary positions"
        heads = self.num_heads
        q = self._query(x, ctx).unflatten(-1, (heads, -1)).transpose(-3, -2)
        compressed = ctx.linear(self.kv_a_proj_with_mqa, x)
        latent, k_rot = compressed.split((self.kv_lora_rank, self.rope_dim), -1)
        kv = ctx.linear(self.kv_b_proj, self.kv_a_layernorm(latent))
        kv = kv.unflatten(-1, (heads, self.nope_dim + self.v_dim)).transpose(-3, -2)
        k_nope, v = kv.split((self.nope_dim, self.v_dim), dim=-1)
        k_rot = k_rot.unsqueeze(-3).expand(*k_nope.shape[:-1], self.rope_dim)
        k = torch.cat((k_nope, k_rot), dim=-1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self._rotate_tail(q, ctx.rope), self._rotate_tail(k, ctx.rope)
        out = ctx.attention(self, q, k, v)
        return ctx.linear(self.o_proj, out.transpose(-3, -2).flatten(-2))
