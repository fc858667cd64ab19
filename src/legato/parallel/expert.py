"""Expert parallelism (the EP applier): shard every MoE layer's experts over a 1-D device mesh (the EP axis).

Rank r of an EP group of size ``ep`` owns experts ``[r*E/ep, (r+1)*E/ep)``; the stacked
expert parameters become DTensors ``Shard(0)`` on the EP mesh, so ``init_weights``,
``state_dict`` and ``torch.distributed.checkpoint`` see the full tensors. Everything else
(router, shared experts, attention, embeddings) is untouched: shard it with FSDP2 over the
data-parallel mesh, passing ``ignored_params=set(expert_parameters(model))`` to every
``fully_shard`` call, so FSDP leaves the experts to EP.

The EP groups cut the ranks whose MoE layers see different tokens: the ``dp x cp``
ranks, or every rank of a stage when ``ep`` folds over the tensor-parallel ranks
(``ep`` does not divide ``dp * cp``, Megatron-Core's parallel folding), where each
sequence-parallel rank routes and dispatches its own shard of the sequence
(``token_shards = tp``). Where those ranks outnumber ``ep``, each expert is held by the
``edp`` ranks of the same EP coordinate (``parallel.mesh``).

Gradients. The combine's backward brings every EP rank's token gradients to the expert's
owner, and the ``edp`` holders sum theirs after the backward (``expert_gradient_groups``),
so an expert's gradient is a *sum* over the tokens of all ``dp * cp`` replicas, where
FSDP and DDP *average* over replicas. The experts' gradient is therefore scaled by
``1 / (dp * cp)`` (``grad_scale``) to follow the same mean convention.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from legato.errors import ConfigError
from legato.moe.chunked_overlap import Overlap
from legato.moe.comm import EPGroup
from legato.moe.experts import GroupedExperts
from legato.moe.layer import MoELayer, moe_layers
from legato.parallel.gradient_reduction import GradientReduction
from legato.parallel.mesh import submesh
from legato.specs.strategy import Strategy, StrategyError


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The routed experts' parameters (to exclude from FSDP under expert parallelism)."""
    return [p for m in model.modules() if isinstance(m, GroupedExperts) for p in m.parameters()]


def overlap_of(strategy: Strategy) -> Overlap:
    """The MoE layer's ``Overlap`` from the strategy's ``moe_overlap`` ('none' = plain)."""
    if strategy.moe_overlap == "none":
        return Overlap()
    return Overlap(strategy.moe_overlap, strategy.moe_chunks, strategy.moe_groups)


def apply_expert(model: nn.Module, strategy: Strategy, mesh: DeviceMesh) -> set[nn.Parameter]:
    """The EP applier: experts sharded over the run mesh's ``ep`` dimension and, with expert
    tensor parallelism (``etp = tp``), each expert's FFN width over ``tp``; returns the
    parameters the data-parallel applier must leave alone (the experts, under ep)."""
    if strategy.ep > 1:
        shards = strategy.tp if strategy.folded_ep else 1
        replicas = strategy.dp * strategy.cp
        apply_expert_parallel(model, submesh(mesh, "ep"), overlap_of(strategy),
                              token_shards=shards, replicas=replicas)  # fmt: skip
    if strategy.etp > 1:
        both = submesh(mesh, "ep_etp") if strategy.ep > 1 else None
        split_expert_ffn(model, submesh(mesh, "tp"), both)
    # experts only split over tp are tensor-parallel DTensors FSDP2 shards like the others
    return set(expert_parameters(model)) if strategy.ep > 1 else set()


def expert_gradient_groups(
    model: nn.Module, strategy: Strategy, mesh: DeviceMesh
) -> list[GradientReduction]:
    """The experts' gradients summed by the ``edp`` ranks that hold the same experts after
    the backward; none when each expert has one holder."""
    if strategy.ep == 1 or strategy.expert_dp == 1:
        return []
    return [GradientReduction(expert_parameters(model), submesh(mesh, "edp").get_group())]


def apply_expert_parallel(
    model: nn.Module,
    ep_mesh: DeviceMesh,
    overlap: Overlap | None = None,
    *,
    token_shards: int = 1,
    replicas: int | None = None,
) -> list[MoELayer]:
    """Shard the experts of every MoE layer in ``model`` over ``ep_mesh`` (1-D), and set
    the layers' overlap schedule; returns the layers. ``token_shards``: how many ranks
    split one replica's tokens (tp when ep folds over it); ``replicas``: the data-parallel
    replicas whose tokens reach an expert (default: the group's, ``ep / token_shards``).
    Works on meta-device models (call ``to_empty`` and ``init_weights`` afterwards) and on
    initialised ones (each rank keeps its slice of the weights it holds)."""
    if ep_mesh.ndim != 1:
        raise ConfigError(f"expert parallelism needs a 1-D ep mesh, got {ep_mesh.ndim} dims")
    size = ep_mesh.size()
    layers = moe_layers(model)
    for layer in layers:
        if layer.num_experts % size:
            raise StrategyError(
                f"strategy.ep ({size}) must divide moe.num_experts ({layer.num_experts})"
            )
        if layer.ep is not None:
            raise ConfigError("apply_expert_parallel: the model already is expert-parallel")
    ep = EPGroup(ep_mesh.get_group(), size, ep_mesh.get_local_rank())
    replicas = replicas or size // token_shards
    for layer in layers:
        _shard(layer.experts, ep_mesh, ep)
        layer.experts.grad_scale = 1.0 / replicas
        layer.ep = ep
        layer.token_shards = token_shards
        if overlap is not None:
            layer.overlap = overlap
    return layers


def _shard(experts: GroupedExperts, mesh: DeviceMesh, ep: EPGroup) -> None:
    for name, param in list(experts.named_parameters(recurse=False)):
        local = param.detach().chunk(ep.size)[ep.rank].clone()
        sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))


# the FFN dimension of each stacked expert parameter ([E, ffn, h], [E, h, ffn], [E, ffn])
_FFN_DIM = {"gate_proj": 1, "up_proj": 1, "down_proj": 2, "gate_proj_bias": 1, "up_proj_bias": 1}


def split_expert_ffn(model: nn.Module, tp_mesh: DeviceMesh, ep_tp_mesh: DeviceMesh | None) -> None:
    """Expert tensor parallelism (Megatron's ``expert_tensor_parallel_size = tp``): each
    tp rank keeps a slice of every expert's FFN width (gate/up column-parallel, down
    row-parallel), of the experts it holds (``ep_tp_mesh``: the 2-D ``(ep, etp)`` mesh
    when the experts are also sharded by ``ep``). The layer then returns a partial sum the
    tensor-parallel plan reduces (``tensor_families``). The down projection's bias would
    be added once per rank; ``parallel.job`` refuses etp for experts with biases."""
    size, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    for layer in moe_layers(model):
        experts = layer.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            dim = _FFN_DIM[name]
            sharded = isinstance(param, DTensor)
            local = param.to_local() if sharded else param
            piece = local.detach().chunk(size, dim)[rank].clone()
            mesh, placements = (
                (ep_tp_mesh, [*param.placements, Shard(dim)])
                if sharded
                else (tp_mesh, [Shard(dim)])
            )
            split = DTensor.from_local(piece, mesh, placements, run_check=False)
            setattr(experts, name, nn.Parameter(split, requires_grad=param.requires_grad))
        layer.expert_tp = tp_mesh.get_group()
