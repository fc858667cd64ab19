"""Prediction: what the cost model says about one (model, cluster, strategy) triple.

A plain frozen record so the planner can rank, print and serialise predictions without
knowing how they were computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prediction:
    """Step time, throughput, utilisation and peak memory of one training step.

    ``mfu`` counts model FLOPs (forward + backward, causal attention, no recompute);
    ``hfu`` and ``tflops_per_device`` count the FLOPs the kernels execute (recompute, and
    the masked half of attention when it is materialised). ``memory_gib`` is the peak of
    the most loaded device; ``why_not_fits`` names the largest memory term when it does not
    fit and is empty otherwise.

    ``breakdown`` holds at least ``compute_s``, ``bubble_s``, ``exposed_comm_s`` and
    ``comm_s`` (both ``{axis: seconds}``) and ``memory_gib`` (``{"params", "grads",
    "optimizer", "activations", "buffers"}``), plus further terms for explanations.
    """

    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    tflops_per_device: float
    memory_gib: float
    fits: bool
    why_not_fits: str = ""
    breakdown: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
