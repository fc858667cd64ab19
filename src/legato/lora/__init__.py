"""Fused multi-task LoRA fine-tuning on one frozen backbone (LOTUS).

Layers, bottom up: ``segmented`` (per-task GEMMs, SGMV-style) -> ``fused_linear`` (the
autograd function: one frozen GEMM plus every task's LoRA) -> ``packed_model`` (the
backbone over several tasks' packed tokens) -> ``trainer`` (per-task optimizers, join and
leave) with ``scheduler`` (which tasks and how many tokens per fused step) and ``overlap``
(ordering compute/communication sub-graphs of fused groups). ``peft_io`` saves adapters in
PEFT's format; ``runner`` is ``legato finetune``. See docs/lora.md.
"""

from legato.lora.adapter import AdapterShape, LoraAdapter, resolve_targets
from legato.lora.config import FinetuneConfig, TaskSection, load_finetune_config
from legato.lora.fused_linear import FusedLoraLinearFunction, Segment, fused_lora_linear
from legato.lora.packed_model import MultiLoraModel, TaskRows
from legato.lora.peft_io import load_adapter, save_adapter
from legato.lora.runner import finetune
from legato.lora.scheduler import CostProfile, PackingScheduler, StepPlan, TaskDemand
from legato.lora.subgraph_order import SubGraph, Timeline, group_subgraphs, order_subgraphs
from legato.lora.task_data import Sequences, TaskSampler, TaskStream, read_task_stream
from legato.lora.trainer import MultiTaskTrainer, TaskStepRecord

__all__ = [
    "AdapterShape",
    "CostProfile",
    "FinetuneConfig",
    "FusedLoraLinearFunction",
    "LoraAdapter",
    "MultiLoraModel",
    "MultiTaskTrainer",
    "PackingScheduler",
    "Segment",
    "Sequences",
    "StepPlan",
    "SubGraph",
    "TaskDemand",
    "TaskRows",
    "TaskSampler",
    "TaskSection",
    "TaskStepRecord",
    "TaskStream",
    "Timeline",
    "finetune",
    "fused_lora_linear",
    "group_subgraphs",
    "load_adapter",
    "load_finetune_config",
    "order_subgraphs",
    "read_task_stream",
    "resolve_targets",
    "save_adapter",
]
