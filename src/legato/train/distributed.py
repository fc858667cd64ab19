"""Process group, device mesh and data-parallel wrapping for the trainer.

Started by torchrun (or ``legato train``'s own launch), every process reads its rank from
the environment; gloo serves CPUs and NCCL GPUs. One process runs without any process
group, so a single-process run needs no launcher and no free port. With several, the
model is sharded with FSDP2 (``fully_shard`` on every block, then the root) over a 1-D
``"dp"`` mesh, or replicated with DDP when ``parallel.fsdp`` is false. A pipeline job
(pp > 1) uses a 2-D ``("pp", "dp")`` mesh instead (``use_pipeline_mesh``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from legato.errors import ConfigError


@dataclass
class DistContext:
    """Who this process is, and the collectives the trainer needs (no-ops alone)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = ""
    mesh: DeviceMesh | None = None
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_rank(self) -> int:
        """This process's index among the data-parallel replicas (which rows it reads)."""
        return self.mesh.get_local_rank("dp") if self.mesh is not None else self.rank

    @property
    def dp_size(self) -> int:
        if self.mesh is None:
            return self.world_size
        return self.mesh.size(self.mesh.mesh_dim_names.index("dp"))

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks in place and return it."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to fill a cache), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def resolve_device(kind: str, local_rank: int = 0) -> torch.device:
    """``train.device``: 'auto' picks this rank's GPU when there is one, else the CPU."""
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    if kind == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(backend: str = "auto", device: str = "auto") -> DistContext:
    """Read torchrun's environment; join (or reuse) the process group when world > 1."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError("parallel.backend: 'nccl' needs CUDA devices; use 'gloo' or 'auto'")
    set_threads(local_world)
    ctx = DistContext(rank, world, local_rank, local_world, dev, backend if world > 1 else "")
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
            ctx.owns_group = True
        ctx.mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",))
    return ctx


def use_pipeline_mesh(ctx: DistContext, pp: int) -> None:
    """Replace ``ctx.mesh`` by the 2-D ``("pp", "dp")`` mesh of a pipeline job.

    pp is the outer dimension (the strategy's rank order): the ranks of one pipeline are
    ``world / pp`` apart and each data-parallel group is a contiguous block of ranks.
    """
    shape = (pp, ctx.world_size // pp)
    ctx.mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=("pp", "dp"))


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def set_threads(local_world_size: int) -> int:
    """Split this host's cores between its processes so they do not oversubscribe."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    threads = max(1, cores // max(1, local_world_size))
    torch.set_num_threads(threads)
    return threads


def wrap_model(
    model: nn.Module,
    ctx: DistContext,
    *,
    fsdp: bool,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    ignored_params: set[nn.Parameter] | None = None,
) -> nn.Module:
    """Data-parallel ``model`` over ``ctx.mesh``: FSDP2 per block then the root, or DDP.

    ``param_dtype`` (e.g. bf16) is FSDP2's mixed precision: parameters are gathered and
    computed in it while the sharded master copy and gradient reduction stay fp32.
    ``ignored_params``: parameters FSDP2 leaves alone (experts sharded by EP).
    Alone (world size 1) the model is returned as is.
    """
    if not ctx.distributed:
        return model
    if not fsdp:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    options = {
        "mesh": ctx.mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": policy,
        "ignored_params": ignored_params,
    }
    for block in model.model.layers:
        fully_shard(block, **options)
    # The root stays gathered after forward (torch's own heuristic for the root: backward
    # needs it at once), which also keeps the LM head whole for a chunked loss computed
    # after ``hidden_states`` returns.
    fully_shard(model, **{**options, "reshard_after_forward": False})
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 shards in place, nothing to unwrap)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Wrap one micro-step's forward and backward; without sync, gradients only accumulate.

    Reducing on the last micro-step only is what makes accumulation cheap: FSDP2 skips
    the reduce-scatter (``set_requires_gradient_sync``), DDP the all-reduce (``no_sync``).
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield
