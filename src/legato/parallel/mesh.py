"""The run's one DeviceMesh, built from its Job in one place.

Dimensions outer to inner ``pp, dp, cp, tp`` (``tp_y, tp_x`` for 2-D tensor parallelism),
the rank order ``cost/mesh.py`` prices, so a group the cost model puts inside a node is
inside the node here too. Every dimension is present, size 1 included, so an applier asks
for ``mesh["cp"]`` without first asking whether there is one. Two flattened dimensions
serve the appliers that span several: ``dp_cp``, the ranks that see different tokens and
average one weight's gradient (FSDP2's and DDP's group; expert parallelism's while
``ep = dp * cp``), and ``tp`` for a 2-D tensor-parallel layout. Ask for any dimension with
``submesh(mesh, name)``: torch deprecates slicing a flattened dimension out of the root
mesh, so the flattened meshes are kept from when they were made.
"""

from __future__ import annotations

import weakref

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from legato.parallel.job import Job

GRADIENT_DIM = "dp_cp"
_FLATTENED: weakref.WeakKeyDictionary[DeviceMesh, dict[str, DeviceMesh]] = (
    weakref.WeakKeyDictionary()
)


def submesh(mesh: DeviceMesh, name: str) -> DeviceMesh:
    """The 1-D mesh of dimension ``name`` (``pp``, ``dp``, ``cp``, ``tp``, ``dp_cp``...)."""
    flat = _FLATTENED.get(mesh, {})
    return flat[name] if name in flat else mesh[name]


def build_mesh(job: Job, device_type: str) -> DeviceMesh | None:
    """The mesh of ``job`` over every process of the default group; None for a job of one
    process (every degree is 1, there is no group and nothing to lay out)."""
    if job.strategy.world_size == 1:
        return None
    shape = job.mesh_shape
    mesh = init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape))
    flat = {GRADIENT_DIM: mesh["dp", "cp"]._flatten(GRADIENT_DIM)}
    if "tp_x" in shape:
        flat["tp"] = mesh["tp_y", "tp_x"]._flatten("tp")
    _FLATTENED[mesh] = flat
    return mesh
