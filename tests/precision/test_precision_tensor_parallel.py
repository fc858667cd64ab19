"""FP8 linears under tensor parallelism: a column- then a row-parallel Fp8Linear (an MLP's
up and down projections) on 2 gloo ranks equal the same pair in one process.

The widths are whole 128-wide tiles per rank, so each rank quantises exactly the tiles
one process does: outputs and gradients differ only by the order the row-parallel
partial sums are added (fp32), not by FP8 rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from gloo_harness import run_ranks
from legato.precision.linear import Fp8Linear

pytestmark = pytest.mark.distributed

HIDDEN, FFN, TOKENS = 256, 512, 6


def _pair(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    up = Fp8Linear(HIDDEN, FFN, bias=True)
    down = Fp8Linear(FFN, HIDDEN, bias=True)
    return nn.Sequential(up, down)


def _run(
    model: nn.Module, x: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The output, and the input's and every parameter's gradient of ``sum(output *
    weights)``."""
    x = x.clone().requires_grad_()
    out = model(x)
    (out * weights).sum().backward()
    grads = {"input": x.grad.clone()}  # a copy: not a pending collective's buffer
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = grad.detach().clone()
    return out.detach(), grads


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The input and the output's weights in the loss (distinct per element)."""
    torch.manual_seed(1)
    return torch.randn(2, TOKENS, HIDDEN), torch.linspace(-1, 1, 2 * TOKENS * HIDDEN).view(
        2, TOKENS, HIDDEN
    )


def _tensor_parallel(rank: int, sequence_parallel: bool) -> tuple:
    mesh = init_device_mesh("cpu", (2,))
    model = _pair()
    stream = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(model, mesh, {
        "0": ColwiseParallel(input_layouts=stream),
        "1": RowwiseParallel(output_layouts=stream),
    })  # fmt: skip
    x, weights = _inputs()
    if sequence_parallel:  # each rank's share of the sequence, in and out
        x, weights = x.chunk(2, dim=1)[rank], weights.chunk(2, dim=1)[rank]
    return _run(model, x, weights)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp-sp"])
def test_tensor_parallel_fp8_linears_equal_one_process(sequence_parallel: bool) -> None:
    want_out, want_grads = _run(_pair(), *_inputs())
    ranks = run_ranks(_tensor_parallel, sequence_parallel)
    outs = [out for out, _ in ranks]
    inputs = [grads.pop("input") for _, grads in ranks]
    if sequence_parallel:  # each rank holds its share of the sequence, in and out
        outs, inputs = [torch.cat(outs, dim=1)], [torch.cat(inputs, dim=1)]
    for got in outs:
        torch.testing.assert_close(got, want_out, rtol=1e-5, atol=1e-6)
    for got in inputs:
        torch.testing.assert_close(got, want_grads["input"], rtol=1e-5, atol=1e-6)
    for _, grads in ranks:
        assert grads.keys() == want_grads.keys() - {"input"}
        for name, grad in grads.items():
            torch.testing.assert_close(grad, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)
