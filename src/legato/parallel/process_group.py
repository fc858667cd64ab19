"""The process group that ``legato train``, ``finetune`` and ``calibrate`` join.

Started by torchrun or by ``legato.parallel.launch``, every process reads who it is from
the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``);
gloo serves CPUs and NCCL GPUs. One process joins no group at all, so a single-process
run needs no launcher and no free port. ``process_group`` is the one way in and out: it
splits the host's cores between the local processes, joins, and on the way out waits for
every rank before tearing the group down (gloo aborts a process whose peer is gone).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from legato.errors import ConfigError
from legato.parallel.launch import die_with_launcher

T = TypeVar("T")


@dataclass
class PendingReduce:
    """An all-reduce in flight over one flat buffer; ``wait`` writes the sums back."""

    tensors: list[Tensor]
    flat: Tensor
    work: dist.Work | None

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        for tensor, chunk in zip(
            self.tensors, self.flat.split([t.numel() for t in self.tensors]), strict=True
        ):
            tensor.copy_(chunk.view_as(tensor))


def all_reduce_flat(
    tensors: Sequence[Tensor], group: dist.ProcessGroup | None = None, *, async_op: bool = False
) -> PendingReduce:
    """Sum ``tensors`` over ``group`` in one collective on an fp32 copy of them all (one
    call instead of one per tensor); ``wait()`` on the result writes the sums back."""
    if not tensors:
        return PendingReduce([], torch.empty(0), None)
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    work = dist.all_reduce(flat, group=group, async_op=async_op)
    return PendingReduce(list(tensors), flat, work)


def broadcast_object(obj: T, group: dist.ProcessGroup | None = None) -> T:
    """The ``obj`` of ``group``'s first rank on all of its ranks (e.g. a plan made from
    local timings, which must be identical everywhere or the collectives would not match)."""
    box = [obj]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]


@dataclass
class DistContext:
    """Who this process is, and the collectives every command needs (no-ops alone)."""

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

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum ``tensor`` over ranks in place and return it."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        return broadcast_object(obj) if self.distributed else obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. to fill a cache), then the others."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def resolve_device(kind: str, local_rank: int = 0, where: str = "train.device") -> torch.device:
    """``where`` ('auto', 'cpu' or 'cuda'): 'auto' picks this rank's GPU when there is one,
    else the CPU."""
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{where}: 'cuda' requested but no CUDA device is available")
    if kind == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def threads_per_process(local_world_size: int) -> int:
    """This host's cores split between its processes (at least one thread each)."""
    return max(1, host_cores() // max(1, local_world_size))


def set_threads(local_world_size: int) -> int:
    """Split this host's cores between its processes so they do not oversubscribe."""
    threads = threads_per_process(local_world_size)
    torch.set_num_threads(threads)
    return threads


def join(backend: str = "auto", device: str = "auto", where: str = "train.device") -> DistContext:
    """Read the launcher's environment; join (or reuse) the process group when world > 1,
    with a 1-D ``"dp"`` mesh over all ranks."""
    die_with_launcher()
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    dev = resolve_device(device, local_rank, where)
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


def leave(ctx: DistContext) -> None:
    """Destroy the group if ``join`` created it (after a failure: no barrier, a peer may
    be gone)."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def exit_worker(code: int) -> None:
    """End a launched worker process (torchrun's or ours) with ``code`` via ``os._exit``.

    ``destroy_process_group`` does not stop gloo's threads (``pt_gloo_runloop``,
    ``gloo_tcp_loop``) while a DeviceMesh, an FSDP module or a DTensor still refers to the
    group. A normal interpreter exit then kills those threads during finalisation; one
    that drops the last reference to a Python-owned tensor there unwinds through a C++
    destructor and ``std::terminate`` aborts the process ("terminate called without an
    active exception", SIGABRT) after its work is done. Everything a worker writes is
    written and closed by then, so it flushes its streams and leaves without finalising.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def process_group(
    backend: str = "auto", device: str = "auto", where: str = "train.device"
) -> Iterator[DistContext]:
    """``join``, run the block, then barrier (no rank tears gloo down while a peer still
    uses it) and ``leave``; on an exception, ``leave`` at once."""
    ctx = join(backend, device, where)
    try:
        yield ctx
        ctx.barrier()
    finally:
        leave(ctx)
