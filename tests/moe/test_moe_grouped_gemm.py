"""Grouped GEMM: torch._grouped_mm where supported, the loop elsewhere, same results."""

from __future__ import annotations

import pytest
import torch

from legato.moe import grouped_mm, grouped_mm_supported

SIZES = [3, 0, 5, 1]  # an empty group included


def _operands(dtype, k=16, m=8):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(sum(SIZES), k, generator=gen).to(dtype).requires_grad_()
    w = torch.randn(len(SIZES), m, k, generator=gen).to(dtype).requires_grad_()
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_equals_per_group_matmul_with_gradients(dtype):
    x, w = _operands(dtype)
    assert grouped_mm_supported(x, w)  # torch 2.13 CPU: fp32/bf16/fp16
    out = grouped_mm(x, w, SIZES, "grouped_mm")
    ref = torch.cat([rows @ w[g].T for g, rows in enumerate(x.split(SIZES))])
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    torch.testing.assert_close(
        torch.autograd.grad(out, [x, w], grad), torch.autograd.grad(ref, [x, w], grad)
    )
    loop = grouped_mm(x, w, SIZES, "loop")
    torch.testing.assert_close(loop, out)


def test_unsupported_operands_fall_back_to_the_loop():
    x, w = _operands(torch.float64)
    assert not grouped_mm_supported(x, w)  # no fp64 grouped GEMM on the CPU
    out = grouped_mm(x, w, SIZES)
    torch.testing.assert_close(out[:3], x[:3] @ w[0].T)
    x10, w10 = _operands(torch.float32, k=10, m=8)
    assert not grouped_mm_supported(x10, w10)  # 40-byte rows: not 16-byte aligned
    assert not grouped_mm_supported(*_operands(torch.float32, k=16, m=6))  # output rows
    x, w = _operands(torch.float32)
    assert not grouped_mm_supported(x, w.bfloat16())
    assert grouped_mm(x10, w10, SIZES).shape == (9, 8)


def test_flop_counter_counts_grouped_gemms_like_the_loop():
    from torch.utils.flop_counter import FlopCounterMode

    counted = {}
    for impl in ("grouped_mm", "loop"):
        x, w = _operands(torch.float32)
        with FlopCounterMode(display=False) as counter:
            grouped_mm(x, w, SIZES, impl).sum().backward()
        counted[impl] = counter.get_total_flops()
    assert counted["grouped_mm"] == counted["loop"] == 3 * 2 * sum(SIZES) * 16 * 8
