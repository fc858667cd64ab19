"""Slice attention with a K/V prefix cache equals full causal attention: the whole model
run slice by slice (forward in order, backward in reverse order, each slice's graph on its
own) gives the same logits and the same gradient for every parameter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from legato.errors import ConfigError
from legato.models import build_model
from legato.models.attention import attention_override
from legato.models.slice_attention import PrefixKVCache
from legato.specs.model import MLASpec, ModelSpec

_BASE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 61, "seq_len": 16}
SPECS = {
    "gqa-rope": ModelSpec(name="gqa", num_kv_heads=2, ffn_hidden_size=48, **_BASE),
    "gpt-learned-tied": ModelSpec(
        name="gpt", mlp="gelu", norm="layernorm", position="learned", bias=True,
        tied_embeddings=True, **_BASE,
    ),
    "mla": ModelSpec(
        name="mla", mla=MLASpec(kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                v_head_dim=6, q_lora_rank=20), **_BASE,
    ),
}  # fmt: skip
CUTS = (0, 5, 9, 11, 16)  # unequal slices, as equal-FLOP slicing makes them


def _full(model, ids, labels):
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return logits.detach(), grads


def _sliced(model, ids, labels, cuts):
    k = len(cuts) - 1
    cache = PrefixKVCache(k)
    params = list(model.parameters())
    logits, losses = [], []
    for j in range(k):
        s, e = cuts[j], cuts[j + 1]
        positions = torch.arange(s, e).expand(ids.shape[0], -1)
        with attention_override(cache.attend_fn(j)):
            out = model(ids[:, s:e], position_ids=positions)
        logits.append(out.detach())
        losses.append(F.cross_entropy(out.flatten(0, 1), labels[:, s:e].flatten(), reduction="sum"))
    total = [torch.zeros_like(p) for p in params]
    for j in reversed(range(k)):
        outputs, grads = cache.backward_terms(j)
        leaves = cache.prefix_leaves(j)
        assert bool(outputs) == (j < k - 1)
        g = torch.autograd.grad(
            [losses[j], *outputs], [*leaves, *params], [torch.ones(()), *grads], allow_unused=True
        )
        cache.add_prefix_grads(j, list(g[: len(leaves)]))
        cache.release(j)
        for acc, grad in zip(total, g[len(leaves) :], strict=True):
            if grad is not None:
                acc += grad
    assert cache.empty
    return torch.cat(logits, dim=1), total


@pytest.mark.parametrize("name", list(SPECS))
def test_slices_with_prefix_cache_equal_full_causal_attention(name):
    model = build_model(SPECS[name], seed=3)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 61, (2, 16), generator=generator)
    labels = torch.randint(0, 61, (2, 16), generator=generator)
    ref_logits, ref_grads = _full(model, ids, labels)
    logits, grads = _sliced(model, ids, labels, CUTS)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    names = [n for n, _ in model.named_parameters()]
    for n, got, want in zip(names, grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


def test_wrong_slice_order_and_masks_are_refused():
    cache = PrefixKVCache(2)
    with pytest.raises(RuntimeError, match="earlier slice"):
        cache.attend_fn(1)
    attend = cache.attend_fn(0)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ConfigError, match="attn_mask"):
        attend(q, q, q, torch.ones(3, 3, dtype=torch.bool))
