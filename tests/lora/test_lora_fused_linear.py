"""The fused multi-task LoRA autograd function against plain per-task autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from legato.lora.fused_linear import Segment, fused_lora_linear

RANKS = (2, 5, 3)
# Three tasks with different ranks and lengths; rows 18:22 belong to a task without an
# adapter on this layer, so they get the base output only.
SEGMENTS = (Segment(0, 10, 0.5), Segment(10, 18, 2.0), Segment(22, 30, 1.0))


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(30, 16, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(12, 16, generator=g, dtype=dtype)
    bias = torch.randn(12, generator=g, dtype=dtype)
    factors = [
        (
            torch.randn(r, 16, generator=g, dtype=dtype, requires_grad=True),
            torch.randn(12, r, generator=g, dtype=dtype, requires_grad=True),
        )
        for r in RANKS
    ]
    return x, weight, bias, factors


def _reference(x, weight, bias, factors, x_lora=None):
    """Each task on its own rows with ordinary autograd ops."""
    x_lora = x if x_lora is None else x_lora
    rows = list(F.linear(x, weight, bias).unbind(0))
    for seg, (a, b) in zip(SEGMENTS, factors, strict=True):
        delta = seg.scale * (x_lora[seg.start : seg.stop] @ a.t()) @ b.t()
        for i in range(seg.length):
            rows[seg.start + i] = rows[seg.start + i] + delta[i]
    return torch.stack(rows)


def _grads(out, x, factors, upstream):
    return torch.autograd.grad(
        out, [x, *[t for pair in factors for t in pair]], upstream, retain_graph=True
    )


def test_loop_backend_matches_per_task_autograd():
    """float64: the fused function adds each task's delta in another operation order than
    per-row autograd (observed 3.6e-15 apart on AVX-512), so only rounding may differ."""
    x, weight, bias, factors = _inputs(torch.float64)
    out = fused_lora_linear(x, weight, bias, SEGMENTS, factors, backend="loop")
    ref = _reference(x, weight, bias, factors)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(
        _grads(out, x, factors, upstream), _grads(ref, x, factors, upstream), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gradcheck_float64():
    x, weight, bias, factors = _inputs(torch.float64)
    flat = [t for pair in factors for t in pair]

    def fn(x, *flat):
        pairs = list(zip(flat[0::2], flat[1::2], strict=True))
        return fused_lora_linear(x, weight, bias, SEGMENTS, pairs, backend="loop")

    assert torch.autograd.gradcheck(fn, (x, *flat))


def test_grouped_backend_matches_loop_backend():
    x, weight, bias, factors = _inputs(torch.float32)
    upstream = torch.randn(30, 12)
    results = {}
    for backend in ("loop", "grouped"):
        out = fused_lora_linear(x, weight, bias, SEGMENTS, factors, backend=backend)
        results[backend] = (out, *_grads(out, x, factors, upstream))
    for got, want in zip(results["grouped"], results["loop"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_separate_lora_input_gets_its_own_gradient():
    """With dropout the LoRA input differs from x; both paths' gradients reach x."""
    x, weight, bias, factors = _inputs(torch.float64)
    keep = torch.rand(30, 16, generator=torch.Generator().manual_seed(1)) > 0.3
    x_lora = x * keep / 0.7
    out = fused_lora_linear(x, weight, bias, SEGMENTS, factors, x_lora=x_lora, backend="loop")
    ref = _reference(x, weight, bias, factors, x_lora)
    upstream = torch.randn_like(out)
    for got, want in zip(
        _grads(out, x, factors, upstream), _grads(ref, x, factors, upstream), strict=True
    ):
        torch.testing.assert_close(got, want)


def test_frozen_weight_gets_no_gradient_and_no_segments_is_plain_linear():
    x, weight, bias, factors = _inputs(torch.float32)
    weight.requires_grad_(True)
    out = fused_lora_linear(x, weight, bias, SEGMENTS, factors)
    out.sum().backward()
    assert weight.grad is None
    assert all(a.grad is not None and b.grad is not None for a, b in factors)
    # no segments: the very same F.linear call, so the same kernel on the same data
    assert torch.equal(fused_lora_linear(x, weight, bias, [], []), F.linear(x, weight, bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_low_precision_activations_keep_fp32_adapter_gradients(dtype):
    x, weight, bias, factors = _inputs(torch.float32)
    out = fused_lora_linear(x.to(dtype), weight.to(dtype), bias.to(dtype), SEGMENTS, factors)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert all(a.grad.dtype == torch.float32 for a, _ in factors)
