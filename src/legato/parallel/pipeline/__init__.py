"""MEPipe's pipeline runtime: stages of the reference model, executed per schedule IR.

``build_stages`` cuts a model into this rank's virtual stages; ``PipelineRunner`` runs a
``legato.schedule.Schedule`` on them with torch.distributed P2P: sequence slices with a
K/V prefix cache, split B/W with deferred per-linear weight-gradient GEMMs, virtual
stages in the interleaved or V placement. See docs/pipeline_schedules.md ("Runtime").
"""

from legato.parallel.pipeline.meter import ActivationMeter
from legato.parallel.pipeline.runner import (
    IGNORE_INDEX,
    PipelineRunner,
    StepStats,
    token_cross_entropy,
)
from legato.parallel.pipeline.stages import StageModule, build_stages, split_layers
from legato.parallel.pipeline.weight_grad import (
    DeferLinearWeightGrads,
    apply_weight_grads,
    weight_grad_groups,
)

__all__ = [
    "IGNORE_INDEX",
    "ActivationMeter",
    "DeferLinearWeightGrads",
    "PipelineRunner",
    "StageModule",
    "StepStats",
    "apply_weight_grads",
    "build_stages",
    "split_layers",
    "token_cross_entropy",
    "weight_grad_groups",
]
