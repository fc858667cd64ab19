"""FP8 GEMM ``a @ b.T`` of two tile-quantised operands, both tiled along K (their last dim).

Two backends compute the same product:

* ``emulated`` (any device): dequantise each operand per tile, then one fp32 matmul. Since
  the scales are constant over every K-block of 128, this equals a real per-tile-scaled FP8
  GEMM (products of e4m3 values are exact in fp32) up to fp32 accumulation order.
* ``scaled_mm``: ``torch._scaled_mm`` for tensor-wise and row-wise scales (CPU and CUDA),
  and ``F.scaled_mm`` with ``BlockWise1x128`` / ``BlockWise128x128`` scales for the
  tile-wise recipe (Hopper with CUDA >= 12.9 only).

``auto`` picks ``scaled_mm`` on CUDA devices of compute capability >= 8.9 and ``emulated``
elsewhere; a shape or build the FP8 kernel refuses falls back to ``emulated`` with one
warning, so a run never dies for want of a kernel.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from legato.errors import ConfigError
from legato.precision.tiles import TILE, TileQuantized

Backend = Literal["auto", "emulated", "scaled_mm"]
BACKENDS: tuple[str, ...] = ("auto", "emulated", "scaled_mm")
_warned: set[str] = set()


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"fp8 backend: unknown {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return "scaled_mm"
    return "emulated"


def fp8_mm(a: TileQuantized, b: TileQuantized, out_dtype: torch.dtype, backend: str) -> Tensor:
    """``a`` [M, K] times ``b`` [N, K] transposed -> [M, N] in ``out_dtype``."""
    if a.shape[1] != b.shape[1]:
        raise ConfigError(f"fp8_mm: K differs, {a.shape} @ {b.shape}.T")
    if resolve_backend(backend, a.data.device) == "scaled_mm":
        try:
            return _scaled_mm(a, b, out_dtype)
        except (RuntimeError, NotImplementedError, ValueError) as err:
            key = f"{a.tile}x{b.tile}:{a.data.device.type}"
            if key not in _warned:
                _warned.add(key)
                warnings.warn(
                    f"fp8: no FP8 kernel for tiles {a.tile} x {b.tile} here ({err}); "
                    "using the emulated path",
                    stacklevel=2,
                )
    return emulated_mm(a, b, out_dtype)


def emulated_mm(a: TileQuantized, b: TileQuantized, out_dtype: torch.dtype) -> Tensor:
    return (a.dequantize() @ b.dequantize().T).to(out_dtype)


def _scaled_mm(a: TileQuantized, b: TileQuantized, out_dtype: torch.dtype) -> Tensor:
    m, n = a.shape[0], b.shape[0]
    a_data, b_data = a.data.contiguous(), b.data.contiguous()  # mat2 must be column-major
    whole = a.tile == tuple(a.data.shape) and b.tile == tuple(b.data.shape)
    rows = a.tile == (1, a.data.shape[1]) and b.tile == (1, b.data.shape[1])
    if whole or rows:
        sa, sb = (a.scale[0, 0], b.scale[0, 0]) if whole else (a.scale, b.scale.T)
        out = torch._scaled_mm(a_data, b_data.T, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    elif a.tile == (1, TILE) and b.tile in ((1, TILE), (TILE, TILE)):
        out = _blockwise(a_data, a.scale, b_data, b.scale, b.tile[0] == 1, out_dtype)
    else:
        raise NotImplementedError(f"no scaled_mm layout for tiles {a.tile} x {b.tile}")
    return out[:m, :n]


def _blockwise(
    a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, b_rows: bool, out_dtype: torch.dtype
) -> Tensor:
    """Hopper block-scaled GEMM; scales laid out outer-dim-major as cuBLASLt expects."""
    st = F.ScalingType
    scale_a = a_scale.T.contiguous().T  # [M, K/128], column-major
    if b_rows:
        scale_b, recipe_b = b_scale.T.contiguous().T, st.BlockWise1x128
    else:  # [N/128, K/128] padded to a multiple of 4 blocks along K, then transposed
        pad = -b_scale.shape[1] % 4
        scale_b, recipe_b = F.pad(b_scale, (0, pad)).contiguous().T, st.BlockWise128x128
    return F.scaled_mm(
        a,
        b.T,
        scale_a,
        st.BlockWise1x128,
        scale_b,
        recipe_b,
        output_dtype=out_dtype,
    )
