"""The tensor-parallel applier: a whole model split over ``mesh["tp"]`` (``tp``, ``sp``).

Every block gets the plan ``tensor_parallel.tensor_parallel_plan`` derives from the
planner's own layout of it (Megatron's column-parallel q/k/v and gate/up, row-parallel
o and down; with ``sp`` the norms and residual stream split on the sequence), so the
trainer runs the collectives the cost model counted. Around the blocks:

* the embedding is vocabulary-parallel (each rank holds ``V / tp`` rows; the lookup of
  ids another rank holds is masked and the partial outputs all-reduced, or
  reduce-scattered onto the sequence split with ``sp``);
* the final norm is sequence-parallel with ``sp``;
* the LM head is column-parallel and leaves the logits split on the vocabulary: the loss
  runs under torch's ``loss_parallel`` (the softmax's max and sum reduced over tp), so
  the ``[tokens x V]`` logits are never gathered on one rank.

Ranks of one tp group read the same rows (``dp_rank`` ignores tp) and count their label
tokens once. MoE layers, MLA, tied embeddings, learned positions and qk-norm are laid out
by ``tensor_families`` from the same dense plan.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from legato.layout.sbp_layout import PartLayout, part_layout
from legato.parallel.mesh import submesh
from legato.parallel.pipeline.stages import StageModule
from legato.parallel.tensor_families import (
    apply_sequence_split_positions,
    apply_tied_head,
    family_plan,
    finish_block,
)
from legato.parallel.tensor_parallel import tensor_parallel_plan
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy


def block_layout(spec: ModelSpec, strategy: Strategy) -> PartLayout:
    """The planner's layout of a dense block under ``strategy``'s tensor parallelism: it
    depends on tp, tp_y and sp only (batch and dtype do not change a placement)."""
    alone = Strategy(tp=strategy.tp, tp_y=strategy.tp_y, sp=strategy.sp, mbs=1, gbs=1,
                     dtype="fp32")  # fmt: skip
    return part_layout(spec, alone, "dense")


def apply_tensor(model: nn.Module, strategy: Strategy, mesh: DeviceMesh) -> None:
    """Split ``model`` (a ``Transformer`` or a pipeline ``StageModule``, identical on every
    rank) in place over the tp dimension of ``mesh``; the loss must then run under
    ``loss_parallel()``. A stage holds the embedding, the final norm and the LM head only
    where it is the first or the last one."""
    tp_mesh = submesh(mesh, "tp")
    dense = tensor_parallel_plan(block_layout(model.spec, strategy))
    replicated = tensor_parallel_plan(block_layout(model.spec, Strategy(tp=strategy.tp)))
    for block in model.blocks:
        plan = family_plan(block, dense, replicated, strategy)
        parallelize_module(block, tp_mesh, plan)
        finish_block(block, tp_mesh)
    stream = Shard(1) if strategy.sp else Replicate()  # the residual stream between blocks
    decoder = getattr(model, "model", model)  # a Transformer's decoder, or the stage itself
    vocabulary = RowwiseParallel(
        input_layouts=Replicate(), output_layouts=stream, use_local_output=not strategy.sp
    )
    ends = [
        (decoder.embed_tokens, vocabulary),
        (getattr(model, "output_embedding", None), vocabulary),  # a last stage's tied one
        (model.lm_head, ColwiseParallel(
            input_layouts=stream, output_layouts=Shard(-1), use_local_output=False
        )),
        (decoder.norm if strategy.sp else None, SequenceParallel()),
    ]  # fmt: skip
    for module, style in ends:
        # a tied embedding is one module for the first and the last stage: laid out once
        if module is not None and not isinstance(module.weight, DTensor):
            parallelize_module(module, tp_mesh, style)
    if model.spec.tied_embeddings and decoder.norm is not None:
        apply_tied_head(decoder.norm, tp_mesh, stream)
    if strategy.sp and decoder.embed_positions is not None:
        apply_sequence_split_positions(decoder.embed_positions, tp_mesh)
    if strategy.sp and isinstance(model, StageModule):
        _cut_stream_at_stage_edges(model, tp_mesh)


def _cut_stream_at_stage_edges(stage: StageModule, tp_mesh: DeviceMesh) -> None:
    """With sp the residual stream is a sequence-split DTensor; between pipeline stages it
    travels as each rank's local shard (``1/tp`` of the tokens of a slice) and becomes a
    DTensor again on the next stage."""
    if not stage.is_first:
        parallelize_module(stage, tp_mesh, PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Shard(1), None),
            use_local_output=False,
        ))  # fmt: skip
    if not stage.is_last:
        parallelize_module(stage, tp_mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Shard(1), use_local_output=True
        ))  # fmt: skip
