"""Quantise tensors to float8 e4m3 with one fp32 scale per tile (DeepSeek-V3 / XTuner style).

A *tile* covers part of the last two dimensions: ``(1, 128)`` is a row slice of 128
elements (activations and gradients), ``(128, 128)`` a square block (weights); ``None``
means the whole extent, so ``(1, None)`` is row-wise and ``(None, None)`` tensor-wise
scaling. Each tile's scale is its amax over the e4m3 maximum (448), computed just in time
from the tensor itself, and the data is padded with zeros to whole tiles. Small tiles keep
one outlier from flattening the resolution of every other value, which is why tile-wise
FP8 trains where tensor-wise loses precision.

``x ≈ data * scale`` elementwise, tile by tile (scales are *decoding* factors, the
convention of ``torch._scaled_mm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from legato.errors import ConfigError
from legato.specs.dtypes import DTYPE_KINDS

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_AMAX_EPS = 1e-12  # an all-zero tile gets a tiny positive scale instead of dividing by 0
TILE = 128

Tile = tuple[int | None, int | None]


@dataclass(frozen=True)
class Fp8Recipe:
    """Tiles of one FP8 training recipe. ``act_tile`` quantises inputs and output
    gradients, ``weight_tile`` weights; every GEMM operand is tiled along its
    contraction dimension (the last one)."""

    name: str
    act_tile: Tile
    weight_tile: Tile


RECIPES = {
    "tilewise": Fp8Recipe("tilewise", (1, TILE), (TILE, TILE)),
    "rowwise": Fp8Recipe("rowwise", (1, None), (1, None)),
    "tensorwise": Fp8Recipe("tensorwise", (None, None), (None, None)),
}


# Training dtypes that mean "FP8 linears" and the recipe each selects.
DTYPE_RECIPES = {name: k.fp8_recipe for name, k in DTYPE_KINDS.items() if k.fp8_recipe}


def get_recipe(recipe: str | Fp8Recipe) -> Fp8Recipe:
    """A recipe by name (``tilewise``, ``rowwise``, ``tensorwise``), by training dtype
    (``fp8``, ``fp8-rowwise``, ``fp8-tensorwise``) or as given."""
    if isinstance(recipe, Fp8Recipe):
        return recipe
    recipe = DTYPE_RECIPES.get(recipe, recipe)
    if recipe not in RECIPES:
        raise ConfigError(f"fp8 recipe: unknown {recipe!r}; allowed: {', '.join(RECIPES)}")
    return RECIPES[recipe]


@dataclass(frozen=True)
class TileQuantized:
    """FP8 ``data`` [..., R', C'] (padded to whole tiles) and fp32 ``scale``
    [..., R'/tr, C'/tc] of a tensor whose last two dimensions were ``shape``."""

    data: Tensor
    scale: Tensor
    shape: tuple[int, int]
    tile: tuple[int, int]  # resolved: no None

    def t(self) -> TileQuantized:
        """The transpose, exactly: a (tr, tc) tiling of x is a (tc, tr) tiling of x.T."""
        return TileQuantized(
            self.data.transpose(-2, -1),
            self.scale.transpose(-2, -1),
            (self.shape[1], self.shape[0]),
            (self.tile[1], self.tile[0]),
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``data * scale`` per tile, cropped to the original shape."""
        tr, tc = self.tile
        *lead, rows, cols = self.scale.shape
        blocks = self.data.to(torch.float32).reshape(*lead, rows, tr, cols, tc)
        full = (blocks * self.scale[..., :, None, :, None]).reshape(self.data.shape)
        return full[..., : self.shape[0], : self.shape[1]].to(dtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * 4


def resolve_tile(tile: Tile, shape: tuple[int, int]) -> tuple[int, int]:
    rows, cols = shape
    return (rows if tile[0] is None else tile[0]) or 1, (cols if tile[1] is None else tile[1]) or 1


def quantize_tiles(x: Tensor, tile: Tile) -> TileQuantized:
    """Quantise the last two dimensions of ``x`` per ``tile`` (leading dims are batched)."""
    if x.dim() < 2:
        raise ConfigError(f"quantize_tiles: need a tensor of >= 2 dims, got shape {tuple(x.shape)}")
    shape = (x.shape[-2], x.shape[-1])
    tr, tc = resolve_tile(tile, shape)
    pad_r, pad_c = -shape[0] % tr, -shape[1] % tc
    xp = F.pad(x.float(), (0, pad_c, 0, pad_r)) if pad_r or pad_c else x.float()
    lead = xp.shape[:-2]
    rows, cols = xp.shape[-2] // tr, xp.shape[-1] // tc
    blocks = xp.reshape(*lead, rows, tr, cols, tc)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=_AMAX_EPS)
    scale = amax / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return TileQuantized(
        q.reshape(xp.shape),
        scale.reshape(*lead, rows, cols),
        shape,
        (tr, tc),
    )


def fake_quantize(x: Tensor, tile: Tile) -> Tensor:
    """Quantise and dequantise (same shape and dtype as ``x``): the FP8 rounding alone."""
    return quantize_tiles(x, tile).dequantize(x.dtype)
