"""Expert parallelism (the EP applier): shard every MoE layer's experts over a 1-D device mesh (the EP axis).

Rank r of an EP group of size ``ep`` owns experts ``[r*E/ep, (r+1)*E/ep)``; the stacked
expert parameters become DTensors ``Shard(0)`` on the EP mesh, so ``init_weights``,
``state_dict`` and ``torch.distributed.checkpoint`` see the full tensors. Everything else
(router, shared experts, attention, embeddings) is untouched: shard it with FSDP2 over the
data-parallel mesh, passing ``ignored_params=set(expert_parameters(model))`` to every
``fully_shard`` call, so FSDP leaves the experts to EP.

Gradients. The combine's backward brings every EP rank's token gradients to the expert's
owner, so an expert's gradient is a *sum* over the EP group, where FSDP and DDP *average*
over ranks. The experts' gradient is therefore scaled by ``1/ep`` (``grad_scale``) to
follow the same mean convention. When ``dp*cp > ep`` the experts are replicated over the
remaining ranks; average their gradients over that complementary mesh (FSDP2 on it, as
torchtitan does, or an all-reduce) like any replicated parameter.
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
from legato.parallel.mesh import GRADIENT_DIM, submesh
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
    """The EP applier: experts sharded over the run mesh's ``dp_cp`` ranks (``ep = dp *
    cp``, as ``parallel.job`` checks); returns the expert parameters the data-parallel
    applier must leave alone."""
    apply_expert_parallel(model, submesh(mesh, GRADIENT_DIM), overlap_of(strategy))
    return set(expert_parameters(model))


def apply_expert_parallel(
    model: nn.Module, ep_mesh: DeviceMesh, overlap: Overlap | None = None
) -> list[MoELayer]:
    """Shard the experts of every MoE layer in ``model`` over ``ep_mesh`` (1-D), and set
    the layers' overlap schedule; returns the layers. Works on meta-device models (call
    ``to_empty`` and ``init_weights`` afterwards) and on initialised ones (each rank keeps
    its slice of the weights it holds)."""
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
    for layer in layers:
        _shard(layer.experts, ep_mesh, ep)
        layer.ep = ep
        if overlap is not None:
            layer.overlap = overlap
    return layers


def _shard(experts: GroupedExperts, mesh: DeviceMesh, ep: EPGroup) -> None:
    for name, param in list(experts.named_parameters(recurse=False)):
        local = param.detach().chunk(ep.size)[ep.rank].clone()
        sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
    experts.grad_scale = 1.0 / ep.size
