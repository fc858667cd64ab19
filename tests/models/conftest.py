"""A zoo of small hand-made specs covering every architecture option the model supports.

Tests that take a ``zoo_spec`` argument run once per zoo entry; ``zoo`` gives them by name.
"""

from __future__ import annotations

import pytest

from legato.specs.model import MLASpec, ModelSpec, MoESpec

_BASE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 61, "seq_len": 16}
_ROUTED = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 24}

ZOO = {
    "llama": ModelSpec(name="llama", num_kv_heads=2, ffn_hidden_size=48, **_BASE),
    "qwen3": ModelSpec(name="qwen3", num_kv_heads=1, head_dim=16, qk_norm=True, **_BASE),
    "gpt": ModelSpec(
        name="gpt",
        mlp="gelu",
        norm="layernorm",
        position="learned",
        bias=True,
        tied_embeddings=True,
        **_BASE,
    ),
    "mixtral": ModelSpec(name="mixtral-mini", num_kv_heads=2, moe=MoESpec(**_ROUTED), **_BASE),
    "gelu-moe": ModelSpec(
        name="gelu-moe",
        mlp="gelu",
        norm="layernorm",
        bias=True,
        qk_norm=True,
        moe=MoESpec(**_ROUTED, num_shared_experts=1, shared_expert_ffn_hidden_size=8),
        **_BASE,
    ),
    "deepseek": ModelSpec(
        name="deepseek",
        moe=MoESpec(**_ROUTED, num_shared_experts=1, first_dense_layers=1, router_score="sigmoid"),
        mla=MLASpec(
            kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=20
        ),
        **_BASE,
    ),
    "mla-full-q": ModelSpec(
        name="mla-full-q",
        norm="layernorm",
        bias=True,
        qk_norm=True,
        tied_embeddings=True,
        mla=MLASpec(kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10),
        **{**_BASE, "num_layers": 3},
    ),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "zoo_spec" in metafunc.fixturenames:
        metafunc.parametrize("zoo_spec", list(ZOO.values()), ids=list(ZOO))


@pytest.fixture
def zoo() -> dict[str, ModelSpec]:
    return ZOO
