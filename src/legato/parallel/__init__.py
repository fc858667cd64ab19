"""Runtime: apply a Strategy's layouts to a model on a DeviceMesh with torch.distributed.

The tensor-parallel names below load on first use, so that a process that only joins a
group or launches workers (``process_group``, ``launch``) does not pay for DTensor.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CollectiveRecorder",
    "LayoutMismatch",
    "apply_tensor_parallel",
    "dtensor_placements",
    "place_input",
    "place_weights",
    "run_dense_layout",
    "tensor_parallel_plan",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("legato.parallel.tensor_parallel"), name)
    raise AttributeError(f"module 'legato.parallel' has no attribute {name!r}")
