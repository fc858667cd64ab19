"""1-D tensor parallelism for the blocks and ends a dense Llama plan does not cover.

The dense plan (``tensor_parallel.tensor_parallel_plan``, derived from the planner's layout)
names q/k/v, o, gate/up and down projections. The other families of ``legato.models``
reuse it where their modules play those roles and add only what their own modules need:

* **MoE layers** (Mixtral, Qwen3-MoE, DeepSeek) run the planner's ``tp_moe`` layout
  (expert tensor parallelism 1): the router and the routed experts are replicated over the
  tp ranks and see every token of the tp group (with sp the layer's input is gathered and
  its output split onto the sequence again), so every tp rank computes the same routing
  and the same expert gradients and nothing needs reducing over tp; experts sharded by
  ``ep`` are sharded over the ``dp x cp`` ranks of each tp coordinate. Shared experts are
  column/row parallel, the dense MLP's plan under another name. With expert tensor
  parallelism (``etp = tp``) each rank holds a slice of every expert's FFN width
  (``expert.split_expert_ffn``): the layer's output, routed and shared experts alike, is
  a partial sum, all-reduced after it (reduce-scattered onto the sequence under sp).
* **MoE layers with ep folded over tp** (``ep = dp * cp * tp``, sp; Megatron-Core's
  parallel folding): each rank routes and dispatches its own sequence shard, so the layer
  takes and returns the local shard; the shared experts gather the tokens for their
  column-parallel GEMMs and reduce-scatter them back after the row-parallel one. The
  router, replicated, sees its rank's tokens only: its gradient is summed over tp after
  the backward (``tp_partial_parameters``; Megatron does the same for sequence-parallel
  weights in its gradient finalisation).
* **MLA** (DeepSeek): the up-projections that make per-head features (``q_b_proj`` or
  ``q_proj``, ``kv_b_proj``) are column-parallel, so each rank holds its heads, and
  ``o_proj`` is row-parallel, the roles of q/k/v and o. The low-rank down-projections and
  their norms stay replicated: every rank computes the same latent. The rotary key part
  is one head shared by all heads, so each rank's gradient for it covers its own heads
  only; it is summed over tp on the way back (Megatron's copy-to-region).
* **tied embeddings**: the vocabulary-parallel embedding is also the LM head: the final
  hidden states become a replicated DTensor and the logits come out split on the
  vocabulary, as from a column-parallel head.
* **learned positions with sp**: the position table is replicated and its output cut onto
  the sequence split (its gradient gathered back whole).
* **qk_norm**: the per-head norms run on each rank's heads; their weight, shared by all
  heads, gets its gradient summed over tp (a norm on a head-split DTensor).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from legato.models.mla import MLAttention
from legato.models.moe import MoE
from legato.moe.comm import sum_gradient
from legato.moe.layer import moe_layers
from legato.specs.strategy import Strategy

Plan = dict[str, ParallelStyle]


def family_plan(block: nn.Module, dense: Plan, replicated_dense: Plan, strategy: Strategy) -> Plan:
    """The plan of ``block`` under ``strategy``'s 1-D tp from the dense plans of the same
    strategy (``dense``) and of tp alone (``replicated_dense``, whose MLP takes and
    returns replicated tensors)."""
    plan = dict(dense)
    if isinstance(block.mlp, MoE):
        plan = {k: v for k, v in plan.items() if not k.startswith("mlp")}
        if strategy.folded_ep:
            plan.update(_folded_moe_plan(block.mlp, replicated_dense))
        else:
            plan.update(_moe_plan(block.mlp, replicated_dense, strategy.sp, strategy.etp > 1))
    if isinstance(block.self_attn, MLAttention):
        plan = _mla_plan(block.self_attn, plan)
    elif block.self_attn.q_norm is not None:  # [b, S, heads, d]: the heads are dim 2
        norm = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan.update({"self_attn.q_norm": norm, "self_attn.k_norm": norm})
    return plan


def _moe_plan(moe: MoE, replicated_dense: Plan, sp: bool, etp: bool) -> Plan:
    """Every token of the tp group through the layer (gathered under sp); its output whole
    on every rank, or with expert tensor parallelism a partial sum reduced after it (then
    cut onto this rank's tokens under sp)."""
    plan: Plan = {}
    if sp or etp:
        plan["mlp"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1) if sp else Replicate(), None),
            desired_input_layouts=(Replicate(), None),
            use_local_input=True,
            output_layouts=Partial() if etp else Replicate(),
            desired_output_layouts=Shard(1) if sp else Replicate(),
            use_local_output=not sp,
        )

    def restyle(style: ParallelStyle) -> ParallelStyle:  # etp: added into the partial sum
        if etp and isinstance(style, RowwiseParallel):
            return RowwiseParallel(output_layouts=Partial(), use_local_output=True)
        return style

    return plan | _shared_experts(moe, replicated_dense, restyle)


def _folded_moe_plan(moe: MoE, replicated_dense: Plan) -> Plan:
    """Each rank's own sequence shard through the layer (as local tokens ``[B*S/tp, h]``;
    ``Strategy.check`` requires sp); the shared experts' GEMMs on all of them, split on the
    token dimension around them."""
    shard = Shard(1)
    plan: Plan = {
        "mlp": PrepareModuleInputOutput(
            input_layouts=(shard, None),
            desired_input_layouts=(shard, None),
            use_local_input=True,
            output_layouts=shard,
            desired_output_layouts=shard,
            use_local_output=False,
        )
    }

    def restyle(style: ParallelStyle) -> ParallelStyle:  # gather tokens, scatter them back
        if isinstance(style, ColwiseParallel):
            return ColwiseParallel(input_layouts=Shard(0))
        if isinstance(style, RowwiseParallel):
            return RowwiseParallel(output_layouts=Shard(0))
        return style

    return plan | _shared_experts(moe, replicated_dense, restyle)


def _shared_experts(
    moe: MoE, replicated_dense: Plan, restyle: Callable[[ParallelStyle], ParallelStyle]
) -> Plan:
    """The shared experts' plan: the dense MLP's (column/row parallel), restyled."""
    if moe.shared_experts is None:
        return {}
    return {
        name.replace("mlp.", "mlp.shared_experts.", 1): restyle(style)
        for name, style in replicated_dense.items()
        if name.startswith("mlp.")
    }


def tp_partial_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradient each tp rank computes from its own tokens only, to be
    summed over tp after the backward: the routers of MoE layers whose ranks route their
    own sequence shards (``token_shards > 1``)."""
    return [p for m in moe_layers(model) if m.token_shards > 1 for p in m.gate.parameters()]


def _mla_plan(attn: MLAttention, plan: Plan) -> Plan:
    """The dense plan with MLA's modules in the roles of q/k/v: heads split where the
    per-head features are made."""
    query = "q_b_proj" if attn.low_rank_q else "q_proj"
    names = {"q_proj": query, "k_proj": "kv_b_proj", "v_proj": "kv_b_proj"}
    out: Plan = {}
    for key, style in plan.items():
        owner, _, leaf = key.rpartition(".")
        if owner == "self_attn" and leaf in names:
            key = f"self_attn.{names[leaf]}"
        elif key == "self_attn" and isinstance(style, PrepareModuleInput):
            # the replicated down-projections take the gathered input as a plain tensor
            style = PrepareModuleInput(
                input_layouts=(Shard(1), None),
                desired_input_layouts=(Replicate(), None),
                use_local_output=True,
            )
        out[key] = style
    return out


def finish_block(block: nn.Module, tp_mesh: DeviceMesh) -> None:
    """What a block's plan cannot say: each rank's head counts, and MLA's shared rotary key
    summed over tp in the backward."""
    tp = tp_mesh.size()
    attn = block.self_attn
    attn.num_heads //= tp
    if isinstance(attn, MLAttention):
        group, split = tp_mesh.get_group(), (attn.kv_lora_rank, attn.rope_dim)
        attn.kv_a_proj_with_mqa.register_forward_hook(
            lambda _m, _i, out: _sum_rotary_key_grad(out, split, group)
        )
    else:
        attn.num_kv_heads //= tp


def _sum_rotary_key_grad(out: Tensor, split: tuple[int, int], group) -> Tensor:
    latent, k_rot = out.split(split, dim=-1)
    return torch.cat((latent, sum_gradient(k_rot, group)), dim=-1)


def apply_tied_head(norm: nn.Module, tp_mesh: DeviceMesh, stream: Shard | Replicate) -> None:
    """Tied embeddings: the final norm's output (``stream``) as a replicated DTensor, so
    ``F.linear`` with the vocabulary-split embedding gives vocabulary-split logits."""
    parallelize_module(norm, tp_mesh, PrepareModuleOutput(
        output_layouts=stream, desired_output_layouts=Replicate(), use_local_output=False
    ))  # fmt: skip


def apply_sequence_split_positions(positions: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Learned positions with sp: the replicated table's output cut onto the sequence
    split of the residual stream."""
    parallelize_module(positions, tp_mesh, PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
    ))  # fmt: skip
