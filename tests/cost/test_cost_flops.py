"""Matmul FLOPs: Megatron-LM's GPT formula, the 6N + attention form, MoE and MLA."""

from __future__ import annotations

import pytest

from legato.cost import forward_flops, layer_forward_flops, training_flops_per_token
from legato.specs import count_params, list_models, load_model

GPT = [name for name in list_models() if name.startswith("gpt3-")]


def _matmul_weights(spec) -> int:
    """Weights a token multiplies: active parameters without embeddings, norms, biases."""
    c = count_params(spec.with_(bias=False))
    tied_head = spec.hidden_size * spec.vocab_size if spec.tied_embeddings else 0
    return c.active - c.embedding - c.position_embedding - c.norms + tied_head


@pytest.mark.parametrize("name", GPT)
def test_megatron_iteration_formula(name):
    """Megatron-LM (SC'21 eq. 3): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration,
    counting non-causal attention and full recompute (4 forward passes) for the blocks and
    3 passes (no recompute) for the logits."""
    spec = load_model(name)
    batch, s, layers, h, vocab = (
        512,
        spec.seq_len,
        spec.num_layers,
        spec.hidden_size,
        spec.vocab_size,
    )
    megatron = 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))
    fwd = forward_flops(spec, batch, s, causal=False)
    ours = 4 * (fwd.total - fwd.lm_head) + 3 * fwd.lm_head
    assert ours == pytest.approx(megatron, rel=1e-12)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_six_n_plus_attention(name):
    """Per training token: 6 N (active matmul weights) + 12 l heads head_dim s (non-causal)."""
    spec = load_model(name)
    s = spec.seq_len
    attention = 12 * spec.num_layers * spec.num_heads * spec.head_dim * s
    expected = 6 * _matmul_weights(spec) + attention
    assert training_flops_per_token(spec, causal=False) == pytest.approx(expected, rel=1e-12)


def test_causal_counts_the_unmasked_half():
    spec = load_model("tiny")
    s, batch = 64, 3
    full = forward_flops(spec, batch, s, causal=False)
    causal = forward_flops(spec, batch, s, causal=True)
    assert causal.attention_scores * 2 * s == full.attention_scores * (s + 1)
    assert causal.total - causal.attention_scores == full.total - full.attention_scores


def test_parts_for_tiny_llama():
    spec = load_model("tiny")  # h 128, 4 heads x 32, 2 kv heads, ffn 384, vocab 4096
    t, s = 2 * 16, 16
    f = forward_flops(spec, 2, s, causal=False)
    assert f.attention_proj == 4 * 2 * t * 128 * (128 + 2 * 64)
    assert f.attention_scores == 4 * 2 * 2 * 4 * s * s * (32 + 32)
    assert f.attention_out == 4 * 2 * t * 128 * 128
    assert f.mlp == 4 * 2 * t * 3 * 128 * 384
    assert f.lm_head == 2 * t * 128 * 4096
    assert f.moe_experts == f.router == 0
    assert f.total == sum(f.parts().values())


def test_moe_counts_top_k_and_shared_experts():
    spec = load_model("tiny-deepseek")  # layer 0 dense; 8 experts top-2 + 1 shared of 128
    t = 4 * 32
    f = forward_flops(spec, 4, 32)
    assert f.moe_experts == 3 * 2 * t * (2 + 1) * 3 * 128 * 128
    assert f.router == 3 * 2 * t * 128 * 8
    assert f.mlp == 2 * t * 3 * 128 * 384
    # MLA: scores use qk dim nope+rope (48), values v_head_dim (32); causal pairs 32*33/2
    assert f.attention_scores == 4 * 2 * 4 * 4 * (32 * 33 // 2) * (48 + 32)
    assert f.attention_out == 4 * 2 * t * 4 * 32 * 128
    dense, moe = layer_forward_flops(spec, 0, 4, 32), layer_forward_flops(spec, 1, 4, 32)
    assert dense.moe_experts == 0 and moe.mlp == 0
    assert f.total == dense.total + 3 * moe.total + f.lm_head


def test_biases_do_not_change_flops():
    spec = load_model("tiny")
    assert forward_flops(spec, 1, 8) == forward_flops(spec.with_(bias=True), 1, 8)


def test_training_flops_per_token_of_deepseek_v3():
    """DeepSeek-V3 activates ~37B parameters: 6 N is ~220 GFLOPs per token, attention at
    4096 tokens adds the rest."""
    spec = load_model("deepseek-v3")
    flops = training_flops_per_token(spec)
    assert 6 * 36e9 < flops < 6 * 45e9
    assert training_flops_per_token(spec, 2 * spec.seq_len) > flops
