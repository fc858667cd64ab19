"""Tile-wise FP8 training (DeepSeek-V3 / XTuner V1): quantisation, FP8 GEMMs and layers.

quantize_tiles(x, tile) -> TileQuantized; .dequantize(); fake_quantize(x, tile)
RECIPES / get_recipe("tilewise" | "rowwise" | "tensorwise") -> Fp8Recipe
fp8_mm(a_q, b_q, out_dtype, backend)            # a @ b.T, "emulated" | "scaled_mm" | "auto"
fp8_linear(x, weight, bias=None, recipe="tilewise", backend="auto")
fp8_grouped_mm(x, weight[E, N, K], sizes, recipe="tilewise", backend="auto")
Fp8Linear; convert_to_fp8(model, recipe="tilewise", *, backend, skip, experts) -> names
"""

from legato.precision.convert import convert_to_fp8
from legato.precision.gemm import BACKENDS, fp8_mm
from legato.precision.linear import Fp8Linear, fp8_grouped_mm, fp8_linear
from legato.precision.tiles import (
    DTYPE_RECIPES,
    FP8_DTYPE,
    FP8_MAX,
    RECIPES,
    Fp8Recipe,
    TileQuantized,
    fake_quantize,
    get_recipe,
    quantize_tiles,
)

__all__ = [
    "BACKENDS",
    "DTYPE_RECIPES",
    "FP8_DTYPE",
    "FP8_MAX",
    "RECIPES",
    "Fp8Linear",
    "Fp8Recipe",
    "TileQuantized",
    "convert_to_fp8",
    "fake_quantize",
    "fp8_grouped_mm",
    "fp8_linear",
    "fp8_mm",
    "get_recipe",
    "quantize_tiles",
]
