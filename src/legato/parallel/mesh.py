"""The run's one DeviceMesh, built from its Job in one place.

Dimensions outer to inner ``pp, dp, cp, tp`` (``tp_y, tp_x`` for 2-D tensor parallelism),
the rank order ``cost/mesh.py`` prices, so a group the cost model puts inside a node is
inside the node here too. Every dimension is present, size 1 included, so an applier asks
for ``mesh["cp"]`` without first asking whether there is one. Flattened dimensions
serve the appliers that span several: ``dp_cp``, the ranks that see different tokens and
average one weight's gradient (FSDP2's and DDP's group); ``dp_cp_tp``, every rank of a
stage (when expert parallelism folds over the tensor-parallel ranks, whose
sequence-parallel MoE layers then see different tokens too); ``tp`` for a 2-D
tensor-parallel layout. Expert parallelism cuts the ranks whose MoE layers see different
tokens (``dp_cp`` or ``dp_cp_tp``) into ``edp x ep``, ep innermost as ``cost/mesh.py``
prices it: ``ep`` shards the experts, ``edp`` holds the same experts and sums their
gradients; with expert tensor parallelism the experts live on the 2-D ``ep_etp`` mesh
(their FFN width split over the tp ranks). Ask for any dimension with
``submesh(mesh, name)``: torch deprecates slicing a flattened dimension out of the root
mesh, so the flattened meshes are kept from when they were made.
"""

from __future__ import annotations

import weakref

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from legato.parallel.job import Job
from legato.specs.strategy import Strategy

GRADIENT_DIM = "dp_cp"
STAGE_DIM = "dp_cp_tp"
_FLATTENED: weakref.WeakKeyDictionary[DeviceMesh, dict[str, DeviceMesh]] = (
    weakref.WeakKeyDictionary()
)


def submesh(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The 1-D mesh of dimension ``name`` (``pp``, ``dp``, ``cp``, ``tp``, ``dp_cp``...)."""
    flat = _FLATTENED.get(mesh, {})
    return flat[name] if name in flat else mesh[name]


def expert_dim(strategy: Strategy) -> str:
    """The mesh dimension the experts are sharded over: the ranks whose MoE layers see
    different tokens (``dp_cp``; every rank of a stage when ``ep`` folds over tp, whose
    sequence-parallel ranks each dispatch their own shard)."""
    return STAGE_DIM if strategy.folded_ep else GRADIENT_DIM


def build_mesh(job: Job, device_type: str) -> DeviceMesh | None:
    """The mesh of ``job`` over every process of the default group; None for a job of one
    process (every degree is 1, there is no group and nothing to lay out)."""
    if job.strategy.world_size == 1:
        return None
    shape = job.mesh_shape
    mesh = init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape))
    flat = {GRADIENT_DIM: mesh["dp", "cp"]._flatten(GRADIENT_DIM)}
    s = job.strategy
    if s.folded_ep or (s.ep > 1 and s.etp > 1):  # 1-D tp (Strategy.check, check_tensor_parallel)
        flat[STAGE_DIM] = mesh["dp", "cp", "tp"]._flatten(STAGE_DIM)
    if s.ep > 1 and s.etp > 1:  # (ep, etp): each expert's rows on ep, its FFN width on tp
        experts = flat[STAGE_DIM]._unflatten(0, (s.expert_dp, s.ep, s.tp), ("edp", "ep", "etp"))
        flat |= {"ep": experts["ep"], "edp": experts["edp"], "ep_etp": experts["ep", "etp"]}
    elif s.ep > 1:  # the token ranks, innermost first: ep groups, each expert on expert_dp
        experts = flat[expert_dim(s)]._unflatten(0, (s.expert_dp, s.ep), ("edp", "ep"))
        flat |= {"ep": experts["ep"], "edp": experts["edp"]}
    if "tp_x" in shape:
        flat["tp"] = mesh["tp_y", "tp_x"]._flatten("tp")
    _FLATTENED[mesh] = flat
    return mesh
