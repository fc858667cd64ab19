"""Exact parameter counts: every part by hand for the tiny presets, the published sizes of
every real preset, and the Megatron-LM GPT formula."""

from __future__ import annotations

import pytest

from legato.specs import count_params, layer_params, list_models, load_model
from legato.specs.model import MLASpec

PUBLISHED = [name for name in list_models() if load_model(name).published_params]

# Published active (per-token) sizes, rounded to about two digits by their authors.
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": 12.9e9,  # Mistral AI, Mixtral of experts announcement
    "mixtral-8x22b": 39e9,  # Mistral AI, Mixtral 8x22B announcement
    "qwen3-30b-a3b": 3.3e9,  # Qwen3 technical report
    "qwen3-235b-a22b": 22e9,  # Qwen3 technical report
    "deepseek-v3": 37e9,  # DeepSeek-V3 technical report
}


def _tolerance(published: float) -> float:
    """Authors round: "1.7B" stands for 1.65-1.75B. Accept 1%, or half a unit in the
    figure's last printed digit (in billions) where that is wider."""
    text = f"{published / 1e9:.6g}"
    decimals = len(text.split(".")[1]) if "." in text else 0
    return max(0.01 * published, 0.5 * 10.0**-decimals * 1e9)


def test_presets_with_published_sizes_exist():
    assert len(PUBLISHED) >= 21
    assert all(not load_model(n).published_params for n in list_models() if n.startswith("tiny"))


@pytest.mark.parametrize("name", PUBLISHED)
def test_count_matches_published_size(name):
    spec = load_model(name)
    total = count_params(spec).total
    assert abs(total - spec.published_params) <= _tolerance(spec.published_params), (
        f"{name}: {total:,} vs published {spec.published_params:,.0f}"
    )


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_active_matches_published_active_size(name):
    active = count_params(load_model(name)).active
    assert abs(active / PUBLISHED_ACTIVE[name] - 1) < 0.02


def test_released_checkpoint_sizes_exactly():
    # Sums of tensor sizes of the released Hugging Face checkpoints.
    assert count_params(load_model("llama2-7b")).total == 6_738_415_616
    assert count_params(load_model("llama2-70b")).total == 68_976_648_192
    assert count_params(load_model("llama3-8b")).total == 8_030_261_248
    assert count_params(load_model("mixtral-8x7b")).total == 46_702_792_704


@pytest.mark.parametrize("name", [n for n in list_models() if n.startswith("gpt3-")])
def test_gpt_formula_of_megatron(name):
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) = 12 l h^2 + 13 l h + (V+s) h; the
    formula leaves out the final LayerNorm (weight and bias, 2h)."""
    spec = load_model(name)
    layers, h = spec.num_layers, spec.hidden_size
    formula = 12 * layers * h * h + 13 * layers * h + (spec.vocab_size + spec.seq_len) * h
    assert count_params(spec).total == formula + 2 * h


def test_tiny_llama_by_part():
    c = count_params(load_model("tiny"))  # h 128, 4 layers, 4 heads, 2 kv heads, ffn 384
    assert c.embedding == c.lm_head == 4096 * 128
    assert c.position_embedding == 0
    assert c.attention == 4 * (128 * 128 + 2 * 64 * 128 + 128 * 128)
    assert c.mlp == 4 * 3 * 128 * 384
    assert c.norms == 4 * 2 * 128 + 128
    assert c.experts == c.shared_experts == c.router == 0
    assert c.total == c.active == 1_836_160


def test_tiny_gpt_by_part():
    c = count_params(load_model("tiny-gpt"))  # bias, layernorm, learned, tied, ffn 512
    assert c.embedding == 4096 * 128
    assert c.position_embedding == 256 * 128
    assert c.lm_head == 0
    assert c.attention == 4 * (4 * 128 * 128 + 4 * 128)
    assert c.mlp == 4 * (2 * 128 * 512 + 512 + 128)
    assert c.norms == 4 * 2 * 2 * 128 + 2 * 128
    assert c.total == 1_350_400


def test_tiny_moe_by_part():
    c = count_params(load_model("tiny-moe"))  # 4 experts top-2, expert ffn 256
    expert = 3 * 128 * 256
    assert c.mlp == 0
    assert c.router == 4 * 4 * 128
    assert c.experts == 4 * 4 * expert
    assert c.active == c.total - 4 * 2 * expert


def test_tiny_deepseek_by_part():
    c = count_params(load_model("tiny-deepseek"))
    # MLA: q_a [64,128], q_b [4*48,64], kv_a [32+16,128], kv_b [4*(32+32),32], o [128,4*32]
    mla = 64 * 128 + 4 * 48 * 64 + 48 * 128 + 4 * 64 * 32 + 128 * 4 * 32
    assert c.attention == 4 * mla
    assert c.norms == 4 * (64 + 32 + 2 * 128) + 128  # q_a/kv_a norms + layer norms + final
    assert c.mlp == 3 * 128 * 384  # first layer dense
    assert c.router == 3 * 8 * 128  # no router bias; the sigmoid bias is a buffer
    assert c.experts == 3 * 8 * 3 * 128 * 128
    assert c.shared_experts == 3 * 3 * 128 * 128
    assert c.active == c.total - 3 * 6 * 3 * 128 * 128
    assert c.total == 2_732_544


def test_qk_norm_and_layernorm_weights():
    spec = load_model("tiny")
    base = count_params(spec).norms
    assert count_params(spec.with_(qk_norm=True)).norms == base + 4 * 2 * 32
    assert count_params(spec.with_(qk_norm=True, norm="layernorm")).norms == 2 * (base + 4 * 64)


def test_mla_full_rank_query():
    spec = load_model("tiny-deepseek")
    full_q = spec.with_(mla=MLASpec(32, 32, 16, 32, q_lora_rank=None))
    saved = (64 * 128 + 4 * 48 * 64) - 4 * 48 * 128  # q_a + q_b replaced by one q_proj
    assert count_params(spec).attention - count_params(full_q).attention == 4 * saved
    assert count_params(spec).norms - count_params(full_q).norms == 4 * 64


def test_biases_on_every_linear_but_router_and_lm_head():
    spec = load_model("tiny-moe").with_(tied_embeddings=False)
    plain, biased = count_params(spec), count_params(spec.with_(bias=True))
    assert biased.attention - plain.attention == 4 * (128 + 2 * 64 + 128)
    assert biased.experts - plain.experts == 4 * 4 * (2 * 256 + 128)
    assert biased.router == plain.router and biased.lm_head == plain.lm_head


def test_layer_params_sum_to_the_blocks():
    for name in ("tiny", "tiny-gpt", "tiny-deepseek", "deepseek-v3"):
        spec = load_model(name)
        c = count_params(spec)
        outside = c.embedding + c.position_embedding + c.lm_head
        final_norm = (2 if spec.norm == "layernorm" else 1) * spec.hidden_size
        blocks = sum(layer_params(spec, i) for i in range(spec.num_layers))
        assert blocks == c.total - outside - final_norm
