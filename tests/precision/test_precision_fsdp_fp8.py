"""FP8 all-gather of FSDP2 weights: same outputs and gradients as the same FP8 model
gathering bf16, with about half the all-gathered bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo_harness import run_ranks
from legato.precision import convert_to_fp8
from legato.precision.fsdp_fp8 import Fp8GatherWeight, enable_fp8_all_gather, gather_tile

# [out, in] per layer, world 2: 128-row shards (128 x 128 blocks align), 32-row shards
# (row-wise fallback) and 33 rows (FSDP2 shards unevenly: gathered in bf16).
SHAPES = [(256, 256), (64, 256), (33, 64)]
ALIGNED = [(256, 256), (512, 256), (256, 512)]


def test_gather_tile_aligns_blocks_with_shards_or_falls_back_to_rows():
    assert gather_tile((128, 128), (256, 256), 2) == (128, 128)
    assert gather_tile((128, 128), (64, 256), 2) == (1, 128)
    assert gather_tile((1, None), (64, 256), 2) == (1, 256)
    assert gather_tile((None, None), (64, 256), 2) == (1, 256)  # tensor-wise needs all rows


def _model(shapes: list[tuple[int, int]], fp8_gather: bool, mesh) -> nn.Sequential:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(k, n, bias=False) for n, k in shapes))
    convert_to_fp8(model, "tilewise", backend="emulated")
    if fp8_gather:
        assert enable_fp8_all_gather(model) == [str(i) for i in range(len(shapes))]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:  # one FSDP group (one all-gather) per weight
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[int], list[torch.Tensor]]:
    """Output, bytes of each all-gather input of the forward, full weight gradients."""
    sizes: list[int] = []
    gather = dist.all_gather_single

    def counting(output, input, *args, **kwargs):
        sizes.append(input.numel() * input.element_size())
        return gather(output, input, *args, **kwargs)

    dist.all_gather_single = counting
    try:
        y = model(x)
    finally:
        dist.all_gather_single = gather
    y.float().square().sum().backward()
    grads = [layer.weight.grad.full_tensor() for layer in model]
    return y, sizes, grads


def _worker(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = torch.randn(16, SHAPES[0][1], generator=torch.Generator().manual_seed(rank))
    _, bytes0, _ = _run(_model(SHAPES, False, mesh), x)
    fp8 = _model(SHAPES, True, mesh)
    _, bytes1, _ = _run(fp8, x)
    assert isinstance(fp8[0].weight.to_local(), Fp8GatherWeight)
    assert [layer.weight._local_tensor.tile for layer in fp8] == [(128, 128), (1, 128), None]

    # Bytes per weight: fp8 + fp32 scales vs bf16; the uneven weight stays bf16.
    ratios = [b1 / b0 for b0, b1 in zip(bytes0, bytes1, strict=True)]
    assert len(ratios) == 3
    assert 0.5 <= ratios[0] < 0.501 and 0.5 <= ratios[1] < 0.52 and ratios[2] == 1.0
    if rank == 0:
        print(f"all-gather bytes fp8/bf16 per weight: {[round(r, 4) for r in ratios]}")

    # Aligned 128 x 128 blocks: each rank quantises its bf16 shard exactly as the FP8
    # GEMM quantises the whole bf16 weight, and re-quantising the dequantised weight
    # gives back the same FP8 values and scales (the block maximum, 448 x scale, is a
    # bf16 number). Both models then run the same kernels, in the same order, on the
    # same FP8 values and scales: outputs and gradients are bitwise equal on any CPU
    # (elementwise quantisation is correctly rounded; no reduction changes order).
    models = [_model(ALIGNED, False, mesh), _model(ALIGNED, True, mesh)]
    (y0, _, grads0), (y1, _, grads1) = (_run(m, x) for m in models)
    assert torch.equal(y1, y0)
    for g0, g1 in zip(grads0, grads1, strict=True):
        assert torch.equal(g1, g0)
    # The optimizer updates the wrapped shards in place; the next gather sees it.
    for m in models:
        torch.optim.AdamW(m.parameters(), lr=1e-2).step()
    with torch.no_grad():
        assert torch.equal(models[1](x), models[0](x))


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_fp8_all_gather_matches_bf16_gather_at_half_the_bytes():
    run_ranks(_worker)
