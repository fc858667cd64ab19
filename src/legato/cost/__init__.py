"""Cost model: FLOPs, memory, collectives and compute efficiency. Pure Python, no torch.

``predict(model, cluster, strategy, *, overlap=True)`` returns a ``Prediction`` (step time,
throughput, MFU/HFU, peak memory per device, whether it fits, and a breakdown by term).
``Runtime`` describes the kernels a run uses; ``Calibration`` holds the tuned constants.
"""

from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.flops import (
    FlopBreakdown,
    forward_flops,
    layer_forward_flops,
    training_flops_per_token,
    training_step_flops,
)
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime
from legato.cost.training_step import predict

__all__ = [
    "CALIBRATION",
    "Calibration",
    "FlopBreakdown",
    "Prediction",
    "Runtime",
    "forward_flops",
    "layer_forward_flops",
    "predict",
    "training_flops_per_token",
    "training_step_flops",
]
