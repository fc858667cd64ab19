"""Activation swap: move each transformer block's saved tensors to host memory in forward
and bring them back one block ahead in backward (XTuner V1), lowering peak device memory
without recomputation.

Ours, built on ``torch.autograd.graph.saved_tensors_hooks`` installed around the forward of
each selected block (module hooks, so state-dict keys and FSDP2 wrapping are untouched):

* pack: a saved activation is copied to (pinned) host memory, on a side stream on CUDA;
  tensors saved twice in one block (the input of q/k/v projections) are copied once;
  parameters, small tensors and the block's non-differentiable inputs (RoPE tables,
  attention masks, shared by every block) stay where they are.
* unpack: the first use of a block's tensors in backward copies the whole block back and
  starts the copy of the block before it, so transfers overlap the backward compute; a
  device copy is dropped after its last use.

Under tensor parallelism a saved activation may be a DTensor: its local shard (waited for,
if a collective still computes it) is swapped like any tensor, and the DTensor is rebuilt
around it (same mesh, placements, shape and stride) when backward unpacks it.

It composes with activation checkpointing: with ``torch.utils.checkpoint`` inside a block
only the checkpoint's saved tensors reach these hooks (the block input, with the
reentrant variant), and the recomputation in backward is never swapped. With FSDP2,
attach after ``fully_shard`` (so the unsharded parameters are recognised and skipped).
On CPU "host" and "device" are the same memory; the copies still happen, and the
:class:`SavedBytes` ledger records what would be resident on the device.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass

import torch
from torch import Tensor, nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor

from legato.memory.saved import SavedBytes, _Held, is_parameter, storage_key, unpack_counted


class _Entry:
    """One swapped activation: its host copy, and a device copy while backward needs it."""

    __slots__ = ("__weakref__", "d2h", "device", "h2d", "host", "nbytes", "pending", "target")

    def __init__(self, host: Tensor, target: torch.device, d2h) -> None:
        self.host, self.target, self.d2h = host, target, d2h
        self.nbytes = host.numel() * host.element_size()
        self.device: Tensor | None = None
        self.h2d = None
        self.pending = 0  # packs not yet unpacked


@dataclass(eq=False)
class _Group:
    """The swapped tensors of one forward of one block."""

    prev: weakref.ref | None
    entries: list[_Entry] = field(default_factory=list)
    fetched: bool = False
    __weakref__: object = field(default=None, init=False, repr=False)


@dataclass(frozen=True)
class _Distributed:
    """A saved DTensor: how its swapped local shard becomes it again."""

    local: object  # what packing the local shard returned
    mesh: object
    placements: tuple
    shape: torch.Size
    stride: tuple[int, ...]


@dataclass
class _Frame:
    hooks: torch.autograd.graph.saved_tensors_hooks | None
    group: _Group
    constants: set[tuple[str, int]]
    seen: dict[tuple, tuple[_Entry, Tensor]]  # originals kept alive until the block ends


class ActivationSwap:
    """Swap the saved activations of ``blocks[i]`` for i in ``layers`` (default: all).

    ``stats`` (a :class:`SavedBytes`) receives the bytes moved and those left resident;
    ``min_bytes`` leaves smaller tensors in place. :meth:`remove` detaches the hooks.
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        *,
        layers: Iterable[int] | None = None,
        min_bytes: int = 1 << 16,
        stats: SavedBytes | None = None,
    ) -> None:
        self.stats = stats if stats is not None else SavedBytes()
        self.min_bytes = min_bytes
        self.layers = sorted(range(len(blocks)) if layers is None else set(layers))
        self._frames: list[_Frame | None] = []
        self._last: weakref.ref | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._handles = []
        for i in self.layers:
            block = blocks[i]
            self._handles.append(block.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._handles.append(block.register_forward_hook(self._exit, always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- forward: one frame of hooks per block call -------------------------------------
    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        in_backward = torch._C._current_graph_task_id() != -1  # checkpoint recomputation
        if in_backward or not torch.is_grad_enabled():
            self._frames.append(None)
            return
        inputs = [*args, *kwargs.values()]
        constants = {
            storage_key(t)
            for t in _tensors(inputs)
            if not t.requires_grad and t.untyped_storage().data_ptr()
        }
        group = _Group(self._last if self._last is not None and self._last() else None)
        frame = _Frame(None, group, constants, {})
        frame.hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: self._pack(frame, t), self._unpack
        )
        frame.hooks.__enter__()
        self._frames.append(frame)

    def _exit(self, module: nn.Module, args: tuple, output) -> None:
        frame = self._frames.pop()
        if frame is not None:
            frame.hooks.__exit__(None, None, None)
            # Break the frame <-> pack-hook cycle so host copies die with the graph.
            frame.hooks = None
            frame.seen.clear()
            if frame.group.entries:
                self._last = weakref.ref(frame.group)

    def _pack(self, frame: _Frame, t: Tensor):
        if isinstance(t, AsyncCollectiveTensor):  # a collective's result not waited for yet
            t = t.wait()
        if is_parameter(t):
            return t
        if isinstance(t, DTensor):
            with torch.no_grad():
                local = self._pack(frame, t.to_local())
            return _Distributed(local, t.device_mesh, t.placements, t.shape, t.stride())
        key = storage_key(t)
        if key in frame.constants or t.numel() * t.element_size() < self.min_bytes:
            return self.stats.hold(t)
        dedup = (key, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if dedup not in frame.seen:
            entry = self._offload(t)
            frame.group.entries.append(entry)
            frame.seen[dedup] = (entry, t)
        entry = frame.seen[dedup][0]
        entry.pending += 1
        return (frame.group, entry)

    def _offload(self, t: Tensor) -> _Entry:
        d2h = None
        if t.is_cuda:
            stream = self._stream(t.device)
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                d2h = torch.cuda.Event()
                d2h.record(stream)
            t.record_stream(stream)
        else:
            host = t.detach().clone()
        entry = _Entry(host, t.device, d2h)
        self.stats.add(entry.nbytes, host=True)
        self.stats.to_host += entry.nbytes
        weakref.finalize(entry, self.stats.remove, entry.nbytes, host=True)
        return entry

    # -- backward: fetch a block, prefetch the one before it --------------------------
    def _unpack(self, handle) -> Tensor:
        if isinstance(handle, _Distributed):
            with torch.no_grad():
                return DTensor.from_local(self._unpack(handle.local), handle.mesh,
                                          handle.placements, run_check=False,
                                          shape=handle.shape, stride=handle.stride)  # fmt: skip
        if not isinstance(handle, tuple):
            return unpack_counted(handle) if isinstance(handle, _Held) else handle
        group, entry = handle
        if not group.fetched:
            self._fetch_group(group)
            prev = group.prev() if group.prev is not None else None
            if prev is not None and not prev.fetched:
                self._fetch_group(prev)
        if entry.device is None:  # used again after its last expected use (retain_graph)
            self._fetch(entry)
        t = entry.device
        if t.is_cuda:
            current = torch.cuda.current_stream(t.device)
            current.wait_event(entry.h2d)
            t.record_stream(current)
        entry.pending -= 1
        if entry.pending <= 0:
            entry.device = None
            self.stats.remove(entry.nbytes)
        return t

    def _fetch_group(self, group: _Group) -> None:
        group.fetched = True
        for entry in group.entries:
            if entry.device is None:
                self._fetch(entry)

    def _fetch(self, entry: _Entry) -> None:
        if entry.target.type == "cuda":
            stream = self._stream(entry.target)
            with torch.cuda.stream(stream):
                stream.wait_event(entry.d2h)
                entry.device = entry.host.to(entry.target, non_blocking=True)
                entry.h2d = torch.cuda.Event()
                entry.h2d.record(stream)
        else:
            entry.device = entry.host.clone()
        self.stats.add(entry.nbytes)
        self.stats.to_device += entry.nbytes

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]


def _tensors(values: Iterable) -> Iterable[Tensor]:
    for v in values:
        if isinstance(v, Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _tensors(v)
        elif is_dataclass(v):  # a block's ForwardContext: rope, masks
            yield from _tensors(getattr(v, f.name) for f in fields(v))
