"""Weight initialisation: deterministic per seed, identical for eager and meta builds."""

from __future__ import annotations

import math

import torch

from legato.models import build_model
from legato.models.weight_init import INIT_STD
from legato.specs.model import ModelSpec


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state_a, state_b = a.state_dict(), b.state_dict()
    assert list(state_a) == list(state_b)
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


def test_same_seed_same_model_other_seed_differs(zoo_spec):
    a = build_model(zoo_spec, seed=11)
    _assert_same_state(a, build_model(zoo_spec, seed=11))
    other = build_model(zoo_spec, seed=12)
    assert not torch.equal(a.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_meta_build_then_init_equals_eager(zoo_spec):
    eager = build_model(zoo_spec, seed=5)
    meta = build_model(zoo_spec, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.init_weights(5)
    _assert_same_state(meta, eager)
    # Non-persistent buffers (RoPE tables) are rebuilt too, so the outputs agree.
    ids = torch.randint(0, zoo_spec.vocab_size, (2, 8))
    torch.testing.assert_close(meta(ids), eager(ids))


def test_init_rules(zoo):
    spec = zoo["gpt"].with_(num_layers=8, hidden_size=64, tied_embeddings=False)
    model = build_model(spec, seed=0)
    block = model.blocks[3]
    assert torch.equal(block.input_layernorm.weight, torch.ones(64))
    assert torch.equal(block.input_layernorm.bias, torch.zeros(64))
    assert torch.count_nonzero(block.self_attn.q_proj.bias) == 0
    assert abs(block.self_attn.q_proj.weight.std().item() - INIT_STD) < 0.002
    out_std = INIT_STD / math.sqrt(2 * spec.num_layers)
    for weight in (block.self_attn.o_proj.weight, block.mlp.down_proj.weight):
        assert abs(weight.std().item() - out_std) < 0.15 * out_std
    assert abs(model.lm_head.weight.std().item() - INIT_STD) < 0.002


def test_moe_init_rules(zoo):
    model = build_model(zoo["deepseek"].with_(num_layers=4), seed=0)
    moe = model.blocks[1].mlp
    out_std = INIT_STD / math.sqrt(8)
    assert abs(moe.experts.down_proj.std().item() - out_std) < 0.15 * out_std
    assert abs(moe.experts.up_proj.std().item() - INIT_STD) < 0.002
    assert torch.equal(moe.gate.e_score_correction_bias, torch.zeros(4))


def test_dtype_and_unseeded_builds():
    spec = ModelSpec(name="t", hidden_size=16, num_layers=1, num_heads=2, vocab_size=10, seq_len=8)
    half = build_model(spec, seed=3, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    full = build_model(spec, seed=3)
    for a, b in zip(half.parameters(), full.parameters(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16))
    torch.manual_seed(0)
    first = build_model(spec)
    torch.manual_seed(0)
    _assert_same_state(first, build_model(spec))
