"""The FP8 applier: tile-wise FP8 block linears for an FP8 ``train.dtype``.

First in ``parallelize``'s order: it swaps module classes in place (parameters and
state-dict keys do not change), so every later applier sees the FP8 modules.
"""

from __future__ import annotations

import torch
from torch import nn

from legato.precision import convert_to_fp8
from legato.precision.fsdp_fp8 import enable_fp8_all_gather
from legato.specs.dtypes import DTYPE_KINDS, FP8_TRAIN_DTYPES


def compute_dtype(dtype: str) -> torch.dtype | None:
    """What the GEMMs around FP8 run in: bf16 for 'bf16' and the FP8 dtypes, fp16 for
    'fp16', else None (fp32). Master weights, gradients and optimizer state stay fp32 in
    every case."""
    return _LOW.get(DTYPE_KINDS[dtype].compute)


_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fp8(model: nn.Module, dtype: str, *, all_gather: bool) -> list[str]:
    """Convert the block linears (and experts) for an FP8 ``dtype``; with ``all_gather``
    FSDP2 then gathers their weights as e4m3 tiles (half of bf16). The converted names."""
    if dtype not in FP8_TRAIN_DTYPES:
        return []
    names = convert_to_fp8(model, dtype)
    if all_gather:
        enable_fp8_all_gather(model)
    return names
