"""FP8 linear layers whose forward, input-gradient and weight-gradient GEMMs all run in FP8.

For ``y = x @ w.T`` (x [T, K], w [N, K]) the three GEMMs contract over different axes, and
every operand is quantised along the axis it is contracted over:

* forward  ``y  = x  @ w.T``:  x per (1, 128) tile along K, w per (128, 128) block;
* dgrad    ``dx = dy @ w``:    dy along N; w.T is the same blocks transposed (exact for
  square blocks, re-quantised from the weight otherwise);
* wgrad    ``dw = dy.T @ x``:  both along T, so dy.T and x.T are re-quantised after the
  transpose (XTuner's fused transpose+quantise+pad).

Only the FP8 activation (1 byte per element plus scales) and the weight tensor itself are
saved for backward; the weight is re-quantised there rather than saved in FP8, so FSDP2
can free the gathered weight after forward as usual. The grouped variant runs the same
three GEMMs per expert of stacked [E, N, K] weights over variable-sized row groups; its
weight-gradient tiles never cross a group boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Partial, Shard

from legato.precision.gemm import fp8_mm
from legato.precision.tiles import (
    Fp8Recipe,
    Tile,
    TileQuantized,
    get_recipe,
    quantize_tiles,
    resolve_tile,
)


def _transposed(q: TileQuantized, tile: Tile, source: Tensor | None = None) -> TileQuantized:
    """``q``'s tensor transposed and tiled by ``tile`` along its new last axis: the exact
    transpose when the tiling allows, else re-quantised (from ``source`` when given)."""
    qt = q.t()
    if qt.tile == resolve_tile(tile, qt.shape):
        return qt
    hp = source if source is not None else q.dequantize()
    return quantize_tiles(hp.T, tile)


def _forward(x: Tensor, w: Tensor, recipe: Fp8Recipe, backend: str) -> tuple[Tensor, TileQuantized]:
    xq = quantize_tiles(x, recipe.act_tile)
    return fp8_mm(xq, quantize_tiles(w, recipe.weight_tile), x.dtype, backend), xq


def _backward(
    dy: Tensor, xq: TileQuantized, w: Tensor, recipe: Fp8Recipe, backend: str, needs: Sequence[bool]
) -> tuple[Tensor | None, Tensor | None]:
    dx = dw = None
    if needs[0]:
        wt = _transposed(quantize_tiles(w, recipe.weight_tile), recipe.weight_tile, w)
        dx = fp8_mm(quantize_tiles(dy, recipe.act_tile), wt, dy.dtype, backend)
    if needs[1]:
        dyt = quantize_tiles(dy.T, recipe.act_tile)
        dw = fp8_mm(dyt, _transposed(xq, recipe.act_tile), w.dtype, backend)
    return dx, dw


class _Fp8Matmul(torch.autograd.Function):
    """``x @ w.T`` for x [T, K] and w [N, K], all three GEMMs in FP8."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, recipe: Fp8Recipe, backend: str) -> Tensor:
        y, xq = _forward(x, w, recipe, backend)
        ctx.save_for_backward(xq.data, xq.scale, w)
        ctx.meta = (xq.shape, xq.tile, recipe, backend)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        data, scale, w = ctx.saved_tensors
        shape, tile, recipe, backend = ctx.meta
        xq = TileQuantized(data, scale, shape, tile)
        dx, dw = _backward(dy, xq, w, recipe, backend, ctx.needs_input_grad[:2])
        return dx, dw, None, None


class _Fp8GroupedMatmul(torch.autograd.Function):
    """Rows of x [T, K] in groups of ``sizes``; group g times ``w[g]`` [N, K] transposed."""

    @staticmethod
    def forward(ctx, x, w, sizes: tuple[int, ...], recipe: Fp8Recipe, backend: str) -> Tensor:
        outs, saved, meta = [], [], []
        for g, rows in enumerate(x.split(list(sizes))):
            y, xq = _forward(rows, w[g], recipe, backend)
            outs.append(y)
            saved += [xq.data, xq.scale]
            meta.append((xq.shape, xq.tile))
        ctx.save_for_backward(w, *saved)
        ctx.meta = (sizes, meta, recipe, backend)
        return torch.cat(outs) if outs else x.new_empty(0, w.shape[-2])

    @staticmethod
    def backward(ctx, dy: Tensor):
        w, *saved = ctx.saved_tensors
        sizes, meta, recipe, backend = ctx.meta
        needs = ctx.needs_input_grad[:2]
        dxs, dws = [], []
        for g, dy_g in enumerate(dy.split(list(sizes))):
            xq = TileQuantized(saved[2 * g], saved[2 * g + 1], *meta[g])
            dx, dw = _backward(dy_g, xq, w[g], recipe, backend, needs)
            dxs.append(dx)
            dws.append(dw)
        dx = torch.cat(dxs) if needs[0] else None
        dw = torch.stack(dws) if needs[1] else None
        return dx, dw, None, None, None


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    recipe: str | Fp8Recipe = "tilewise",
    backend: str = "auto",
) -> Tensor:
    """``F.linear`` with FP8 GEMMs; ``x`` [..., K]. The bias is added in ``x``'s dtype."""
    flat = x.reshape(-1, x.shape[-1])
    y = _Fp8Matmul.apply(flat, weight, get_recipe(recipe), backend)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def fp8_grouped_mm(
    x: Tensor,
    weight: Tensor,
    sizes: Sequence[int],
    recipe: str | Fp8Recipe = "tilewise",
    backend: str = "auto",
) -> Tensor:
    """FP8 twin of ``legato.moe.grouped_gemm.grouped_mm``: ``x`` [n, k] with rows grouped
    (``sizes[g]`` rows for group g) times ``weight[g]`` [m, k] transposed -> [n, m]."""
    return _Fp8GroupedMatmul.apply(
        x, weight, tuple(int(s) for s in sizes), get_recipe(recipe), backend
    )


class Fp8Linear(nn.Linear):
    """``nn.Linear`` computing with :func:`fp8_linear`; same parameters and state dict.

    Under tensor parallelism (a DTensor weight, laid out by ``parallelize_module``'s
    column- or row-parallel style) the FP8 GEMMs run on each rank's shards, as torchao's
    float8 tensor-parallel styles do: column-parallel, the replicated input times the
    weight's rows gives this rank's output features; row-parallel, the input's feature
    shard times the weight's columns gives a partial sum, which the style then reduces (the
    bias, replicated, is added once by DTensor). Where each shard is a whole number of
    128-wide tiles, every rank quantises exactly the tiles one process would."""

    fp8_recipe: Fp8Recipe = get_recipe("tilewise")
    fp8_backend: str = "auto"

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.weight, DTensor):
            return self._sharded(x)
        return fp8_linear(x, self.weight, self.bias, self.fp8_recipe, self.fp8_backend)

    def _sharded(self, x: Tensor) -> Tensor:
        weight, mesh = self.weight, self.weight.device_mesh
        split = weight.placements[0]
        if not isinstance(x, DTensor) or mesh.ndim != 1 or not isinstance(split, Shard):
            raise NotImplementedError(
                f"Fp8Linear: a 1-D column- or row-parallel weight and a DTensor input, got "
                f"{weight.placements} and {type(x).__name__}"
            )
        if split.dim == 0:  # column-parallel: the input replicated, this rank's features out
            # each rank's input gradient covers its own features only: a partial sum
            local = x.to_local(grad_placements=[Partial()])
            bias = self.bias.to_local() if self.bias is not None else None
            y = fp8_linear(local, weight.to_local(), bias, self.fp8_recipe, self.fp8_backend)
            return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
        y = fp8_linear(x.to_local(), weight.to_local(), None, self.fp8_recipe, self.fp8_backend)
        partial = DTensor.from_local(y, mesh, [Partial()], run_check=False)
        return partial if self.bias is None else partial + self.bias

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8={self.fp8_recipe.name}"
