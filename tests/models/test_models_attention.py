"""Attention pieces: GQA vs MHA, RoPE's relative-position property, MLA against a naive
restatement of DeepSeek's equations."""

from __future__ import annotations

import math

import torch

from legato.models.attention import Attention, SdpaAttention
from legato.models.forward_context import ForwardContext
from legato.models.mla import MLAttention
from legato.models.rope import RotaryEmbedding, apply_rope


def _randomise(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def test_gqa_equals_mha_with_repeated_kv_weights(zoo):
    spec = zoo["llama"]  # 4 heads sharing 2 K/V heads
    gqa = Attention(spec)
    mha = Attention(spec.with_(num_kv_heads=spec.num_heads))
    _randomise(gqa, 0)
    group = spec.num_heads // spec.num_kv_heads
    d = spec.head_dim
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            heads = getattr(gqa, name).weight.view(spec.num_kv_heads, d, -1)
            getattr(mha, name).weight.copy_(heads.repeat_interleave(group, dim=0).flatten(0, 1))
    x = torch.randn(2, 9, spec.hidden_size)
    rope = RotaryEmbedding(d, spec.seq_len, spec.rope_theta)(torch.arange(9).expand(2, 9))
    ctx = ForwardContext(rope, SdpaAttention())
    torch.testing.assert_close(gqa(x, ctx), mha(x, ctx))


def test_rope_scores_depend_only_on_relative_position():
    rotary = RotaryEmbedding(dim=8, max_positions=64, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int, interleaved: bool = False) -> torch.Tensor:
        cos_m, sin_m = rotary(torch.tensor([[m]]))
        cos_n, sin_n = rotary(torch.tensor([[n]]))
        q_m = apply_rope(q, cos_m, sin_m, interleaved=interleaved)
        k_n = apply_rope(k, cos_n, sin_n, interleaved=interleaved)
        return (q_m * k_n).sum()

    for interleaved in (False, True):
        torch.testing.assert_close(score(3, 1, interleaved), score(40, 38, interleaved))
        torch.testing.assert_close(score(0, 0, interleaved), score(17, 17, interleaved))
        assert not torch.allclose(score(3, 1, interleaved), score(3, 2, interleaved))
    # Rotation preserves the norm, and position 0 is the identity.
    cos, sin = rotary(torch.tensor([[0, 9]]))
    x = torch.randn(1, 1, 2, 8)
    rotated = apply_rope(x, cos, sin)
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def _naive_mla(attn: MLAttention, x: torch.Tensor, rope) -> torch.Tensor:
    """DeepSeek MLA written head by head with explicit softmax, from the module's weights."""
    b, s, _ = x.shape
    nope, rot, v_dim, rank = attn.nope_dim, attn.rope_dim, attn.v_dim, attn.kv_lora_rank
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(b, s, attn.num_heads, -1)
    compressed = attn.kv_a_proj_with_mqa(x)
    latent, k_rot = compressed[..., :rank], compressed[..., rank:]
    kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(b, s, attn.num_heads, nope + v_dim)
    k_rot = apply_rope(k_rot.unsqueeze(1), *rope, interleaved=True)[:, 0]  # [b, s, rot]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    heads = []
    for h in range(attn.num_heads):
        q_rot = apply_rope(q[:, :, h, nope:].unsqueeze(1), *rope, interleaved=True)[:, 0]
        scores = q[:, :, h, :nope] @ kv[:, :, h, :nope].transpose(1, 2) + q_rot @ k_rot.transpose(
            1, 2
        )
        scores = (scores / math.sqrt(nope + rot)).masked_fill(~causal, float("-inf"))
        heads.append(scores.softmax(-1) @ kv[:, :, h, nope:])
    return attn.o_proj(torch.cat(heads, dim=-1))


def test_mla_matches_naive_per_head_attention(zoo):
    spec = zoo["deepseek"]
    attn = MLAttention(spec)
    _randomise(attn, 1)
    with torch.no_grad():  # RMSNorm weights stay near 1, as trained models have them
        attn.q_a_layernorm.weight.fill_(1.0)
        attn.kv_a_layernorm.weight.fill_(1.0)
    x = torch.randn(2, 7, spec.hidden_size)
    rope = RotaryEmbedding(attn.rope_dim, spec.seq_len, spec.rope_theta)(
        torch.arange(7).expand(2, 7)
    )
    torch.testing.assert_close(
        attn(x, ForwardContext(rope, SdpaAttention())),
        _naive_mla(attn, x, rope),
        rtol=1e-4,
        atol=1e-5,
    )
