"""FP8 all-gather of FSDP2-sharded ``Fp8Linear`` weights: each rank quantises its own shard.

FSDP2 all-gathers whatever a parameter's local tensor returns from ``fsdp_pre_all_gather``
and rebuilds the whole parameter with ``fsdp_post_all_gather``. ``Fp8GatherWeight`` wraps
the high-precision shard (it *is* the parameter for the optimizer and checkpoints) and
hands FSDP2 its float8 e4m3 bytes plus one fp32 scale per tile instead: about half the
traffic of bf16. Scales come from the shard alone, so no rank has to agree with another.

FSDP2 shards dim 0 in ``N / world`` rows. When those rows are whole weight tiles (128 x 128
blocks of the tile-wise recipe: ``N / world`` a multiple of 128) each rank's blocks *are*
blocks of the full weight, and the gathered bytes are exactly the quantisation the FP8
GEMM makes of the whole weight. Otherwise the shard is quantised row-wise (one row per
tile, the recipe's column tile), which keeps rows from crossing shards but is not the
GEMM's own tiling (``gather_tile`` decides; ``Fp8GatherWeight.tile`` records it). A
weight FSDP2 shards unevenly (``N`` not divisible by the world size) is gathered in the
parameter dtype as usual. After the gather the weight is dequantised into the parameter
dtype and ``Fp8Linear`` quantises it per tile as always: for aligned blocks that gives back
the same FP8 values and scales (a block's maximum, 448 x scale, is a bf16 number), so the
GEMMs are bitwise those of gathering the bf16 weight.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from legato.precision.linear import Fp8Linear
from legato.precision.tiles import FP8_DTYPE, Tile, TileQuantized, quantize_tiles, resolve_tile

# Ops FSDP2 applies to a parameter while sharding and padding it (chunk, new_zeros, narrow,
# copy_, view, ...): their results stay wrapped, so the sharded local tensor keeps the hooks.
_KEEP_WRAPPED = {
    torch.ops.aten.detach.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_zeros.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.slice.Tensor,
    torch.ops.aten.narrow.default,
    torch.ops.aten.split.Tensor,
    torch.ops.aten.split_with_sizes.default,
    torch.ops.aten.view.default,
    torch.ops.aten.as_strided.default,
    torch.ops.aten.copy_.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten.clone.default,
    torch.ops.aten._pin_memory.default,
}


def gather_tile(weight_tile: Tile, shape: tuple[int, int], world: int) -> tuple[int, int]:
    """The tile each rank quantises its dim-0 shard of a ``shape`` weight with: the
    recipe's tile when its rows divide the shard's rows, else row-wise (1, column tile)."""
    rows, cols = resolve_tile(weight_tile, shape)
    return (rows, cols) if (shape[0] // world) % rows == 0 else (1, cols)


class Fp8GatherWeight(Tensor):
    """A high-precision weight (shard) that FSDP2 all-gathers as tile-wise FP8."""

    _tensor: Tensor
    weight_tile: Tile
    tile: tuple[int, int] | None  # chosen at the first all-gather (None: not yet / uneven)

    @staticmethod
    def __new__(cls, tensor: Tensor, weight_tile: Tile):
        return Tensor._make_wrapper_subclass(
            cls,
            tensor.size(),
            strides=tensor.stride(),
            storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype,
            layout=tensor.layout,
            device=tensor.device,
            requires_grad=tensor.requires_grad,
        )

    def __init__(self, tensor: Tensor, weight_tile: Tile) -> None:
        self._tensor = tensor
        self.weight_tile = weight_tile
        self.tile = None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        tiles = [a.weight_tile for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, cls)]
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._tensor, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _KEEP_WRAPPED:
            return out
        return pytree.tree_map_only(Tensor, lambda t: cls(t, tiles[0]), out)

    def __tensor_flatten__(self):
        return ["_tensor"], self.weight_tile

    @staticmethod
    def __tensor_unflatten__(inner, weight_tile, outer_size, outer_stride):
        return Fp8GatherWeight(inner["_tensor"], weight_tile)

    def __repr__(self) -> str:
        return f"Fp8GatherWeight({self._tensor!r}, weight_tile={self.weight_tile})"

    def fsdp_pre_all_gather(
        self, mesh, outer_size: torch.Size, outer_stride, module: nn.Module, mp_policy
    ) -> tuple[tuple[Tensor, ...], Any]:
        """This rank's shard as FP8 bytes and fp32 tile scales (or, sharded unevenly, in
        the parameter dtype padded to FSDP2's shard size)."""
        dtype = mp_policy.param_dtype or self._tensor.dtype
        world = mesh.size()
        shard = self._tensor.to(dtype)
        rows, cols = outer_size
        if rows % world:
            padded = -(-rows // world)
            return (nn.functional.pad(shard, (0, 0, 0, padded - shard.shape[0])),), (rows, None)
        self.tile = gather_tile(self.weight_tile, (rows, cols), world)
        q = quantize_tiles(shard, self.tile)
        # Column padding (cols not a multiple of the tile) is the same on every rank.
        return (q.data, q.scale), (rows, self.tile)

    def fsdp_post_all_gather(
        self,
        outputs: tuple[Tensor, ...],
        metadata: Any,
        param_dtype: torch.dtype,
        *,
        out: Tensor | None = None,
    ):
        """The whole weight in ``param_dtype``: dequantised from the gathered tiles."""
        rows, tile = metadata
        cols = self.shape[1]
        if tile is None:  # sharded unevenly: a plain gather, FSDP2's padding cropped
            full = outputs[0].view(-1, cols)[:rows]
        else:
            data, scale = outputs
            tr, tc = tile
            padded_cols = -(-cols // tc) * tc
            q = TileQuantized(
                data.view(FP8_DTYPE).view(rows, padded_cols),
                scale.view(rows // tr, padded_cols // tc),
                (rows, cols),
                (tr, tc),
            )
            full = q.dequantize(param_dtype)
        if out is not None:  # a re-gather into the parameter autograd may have saved:
            out.data.copy_(full)  # refill its storage as FSDP2's own gather does (no version bump)
            return None
        return full, (full,)


def enable_fp8_all_gather(model: nn.Module) -> list[str]:
    """Make FSDP2 all-gather every ``Fp8Linear`` weight of ``model`` in FP8 (tiled by the
    module's recipe); call after ``convert_to_fp8`` and before ``fully_shard``. Returns the
    qualified names of the modules whose weights now gather in FP8."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, Fp8Linear) or isinstance(module.weight, Fp8GatherWeight):
            continue
        weight = module.weight
        wrapped = Fp8GatherWeight(weight.data, module.fp8_recipe.weight_tile)
        module.weight = nn.Parameter(wrapped, requires_grad=weight.requires_grad)
        names.append(name)
    return names
