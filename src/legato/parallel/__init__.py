"""Runtime: apply a Strategy's layouts to a model on a DeviceMesh with torch.distributed."""

from legato.parallel.tensor_parallel import (
    CollectiveRecorder,
    LayoutMismatch,
    apply_tensor_parallel,
    dtensor_placements,
    place_input,
    place_weights,
    run_dense_layout,
    tensor_parallel_plan,
)

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
