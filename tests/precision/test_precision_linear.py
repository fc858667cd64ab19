"""FP8 GEMMs and layers: emulation equals real FP8 kernels, and all three GEMMs are FP8."""

from __future__ import annotations

import pytest
import torch

from legato.precision import fp8_grouped_mm, fp8_linear, fp8_mm, get_recipe, quantize_tiles


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _fq(x: torch.Tensor, tile) -> torch.Tensor:
    return quantize_tiles(x, tile).dequantize()


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_emulated_equals_cpu_scaled_mm(recipe: str) -> None:
    """torch._scaled_mm runs real e4m3 GEMMs on the CPU for these scalings."""
    r = get_recipe(recipe)
    a, b = (
        quantize_tiles(_rand(96, 256), r.act_tile),
        quantize_tiles(_rand(80, 256, seed=1), r.weight_tile),
    )
    real = fp8_mm(a, b, torch.float32, "scaled_mm")
    emulated = fp8_mm(a, b, torch.float32, "emulated")
    torch.testing.assert_close(emulated, real, rtol=1e-5, atol=1e-4)


def test_tilewise_emulation_equals_a_per_block_fp8_kernel() -> None:
    """A tile-wise GEMM is a sum over K-blocks of row-scaled FP8 GEMMs: run each block
    through CPU torch._scaled_mm and compare with the dequantise-then-matmul emulation."""
    a = quantize_tiles(_rand(64, 300), (1, 128))
    b = quantize_tiles(_rand(200, 300, seed=1), (128, 128))
    out = torch.zeros(64, 256)
    for kb in range(a.scale.shape[1]):
        cols = slice(kb * 128, (kb + 1) * 128)
        b_rows_scale = b.scale[:, kb].repeat_interleave(128)[:, None]  # [N', 1]
        out += torch._scaled_mm(
            a.data[:, cols].contiguous(),
            b.data[:, cols].contiguous().T,
            scale_a=a.scale[:, kb : kb + 1].contiguous(),
            scale_b=b_rows_scale.T.contiguous(),
            out_dtype=torch.float32,
        )
    emulated = fp8_mm(a, b, torch.float32, "emulated")
    torch.testing.assert_close(emulated, out[:, :200], rtol=1e-5, atol=1e-4)


def test_forward_and_both_gradients_are_tilewise_fp8_gemms() -> None:
    """dx uses dy tiled along N and w's 128x128 blocks; dw uses dy.T and x.T re-tiled
    along tokens (x from its saved FP8 copy)."""
    x = _rand(150, 200).requires_grad_()
    w = _rand(90, 200, seed=1).requires_grad_()
    dy = _rand(150, 90, seed=2)
    y = fp8_linear(x, w)
    y.backward(dy)
    act, blk = (1, 128), (128, 128)
    xq = _fq(x.detach(), act)
    torch.testing.assert_close(y, xq @ _fq(w.detach(), blk).T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, _fq(dy, act) @ _fq(w.detach(), blk), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, _fq(dy.T, act) @ _fq(xq.T, act).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("recipe", ["tilewise", "rowwise", "tensorwise"])
def test_fp8_linear_tracks_fp32(recipe: str) -> None:
    x = _rand(4, 33, 256).requires_grad_()
    w = (_rand(96, 256, seed=1) / 16).requires_grad_()
    b = _rand(96, seed=2).requires_grad_()
    fp8_linear(x, w, b, recipe).square().mean().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    torch.nn.functional.linear(x, w, b).square().mean().backward()
    for got, ref in zip(grads, (x.grad, w.grad, b.grad), strict=True):
        assert float((got - ref).norm() / ref.norm()) < 0.08


def test_bf16_inputs_keep_their_dtype() -> None:
    x = _rand(8, 128).bfloat16().requires_grad_()
    w = _rand(64, 128, seed=1).bfloat16().requires_grad_()
    y = fp8_linear(x, w)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == w.grad.dtype == torch.bfloat16


def test_grouped_equals_per_group_linear_and_handles_empty_groups() -> None:
    sizes = [70, 0, 130, 1]
    x = _rand(201, 256).requires_grad_()
    w = (_rand(4, 96, 256, seed=1) / 16).requires_grad_()
    dy = _rand(201, 96, seed=2)
    fp8_grouped_mm(x, w, sizes).backward(dy)
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    parts = [fp8_linear(rows, w[g]) for g, rows in enumerate(x.split(sizes))]
    torch.cat(parts).backward(dy)
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-5)
    assert bool((gw[1] == 0).all())


def test_scaled_mm_without_a_block_scaled_kernel_falls_back_with_a_warning() -> None:
    a = quantize_tiles(_rand(32, 256), (1, 128))
    b = quantize_tiles(_rand(128, 256, seed=1), (128, 128))
    with pytest.warns(UserWarning, match="using the emulated path"):
        got = fp8_mm(a, b, torch.float32, "scaled_mm")  # CPU: no block-scaled kernel
    torch.testing.assert_close(got, fp8_mm(a, b, torch.float32, "emulated"))
