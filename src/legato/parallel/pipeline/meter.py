"""Live activation bytes of one rank, measured on the real tensors (CPU or GPU).

Activation memory is what a pipeline schedule trades: the tensors autograd saves for the
backward, plus what the runtime itself keeps of a unit until its backward (the stage
input and output, the K/V of a slice for later slices, the X and dY a deferred W needs).
:class:`ActivationMeter` counts them by *storage* (views and tensors sharing memory count
once) for exactly as long as they are alive: tensors are wrapped in a :class:`Held` handle
whose release (when autograd frees the saved tensor, or when the runtime drops its
reference) takes the bytes off. Parameters are never counted. ``peak`` is the most bytes
alive at once; unlike allocator statistics it works on CPU and ignores short-lived
temporaries, so it measures the schedule and not the kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


class Held:
    """A tensor that counts towards the meter while this handle lives."""

    __slots__ = ("__weakref__", "key", "meter", "tensor")

    def __init__(self, tensor: Tensor, meter: ActivationMeter | None, key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        if self.meter is not None:
            self.meter._release(self.key)


class ActivationMeter:
    """Bytes of activation storages alive now (``current``) and at most (``peak``)."""

    def __init__(self, exclude: Iterable[Tensor] = ()) -> None:
        self.exclude(exclude)
        self._live: dict[int, list[int]] = {}  # storage key -> [bytes, handles]
        self.current = 0
        self.peak = 0

    def exclude(self, tensors: Iterable[Tensor]) -> None:
        """Never count these storages (parameters, buffers). Replaces the previous set:
        FSDP2 gathers a stage's parameters into new storage every step."""
        self._exclude = {_key(t) for t in tensors}

    def hold(self, tensor: Tensor) -> Held:
        """Count ``tensor``'s storage until the returned handle is released."""
        key = _key(tensor)
        if key in self._exclude or key == 0:
            return Held(tensor, None, key)
        entry = self._live.get(key)
        if entry is None:
            nbytes = _plain(tensor).untyped_storage().nbytes()
            self._live[key] = [nbytes, 1]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        else:
            entry[1] += 1
        return Held(tensor, self, key)

    def _release(self, key: int) -> None:
        entry = self._live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[key]

    def reset_peak(self) -> None:
        self.peak = self.current

    @contextlib.contextmanager
    def saved_tensors(self) -> Iterator[None]:
        """Count every tensor autograd saves for backward inside the block."""
        with torch.autograd.graph.saved_tensors_hooks(self.hold, _unpack):
            yield


def _unpack(held: Held) -> Tensor:
    return held.tensor


def _plain(tensor: Tensor) -> Tensor:
    """The tensor that owns the memory of a wrapper subclass (a DTensor's local shard, the
    result an async collective wraps); ``tensor`` itself otherwise."""
    while is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        tensor = getattr(tensor, names[0])
    return tensor


def _key(tensor: Tensor) -> int:
    tensor = _plain(tensor)
    if tensor.device.type == "meta" or tensor.is_sparse:
        return 0
    return tensor.untyped_storage().data_ptr()
