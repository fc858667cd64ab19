"""Count the bytes of activations autograd holds for backward, by where they live.

CPU-only machines cannot show activation swap in a memory profile (host and device are the
same memory), so the evidence is this ledger: every saved tensor that is not a parameter
is counted once per storage while autograd still references it, as resident on the
compute device or (once swapped) on the host. :func:`count_saved_tensors` is the
no-swap baseline; ``ActivationSwap`` books into the same ledger.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor


def is_parameter(t: Tensor) -> bool:
    """Parameters (also FSDP2's unsharded ones) and views of them (``F.linear`` saves
    ``weight.t()``) are leaves that require grad, or views of one; they stay resident for
    other reasons, so neither the ledger nor the swap touches them."""
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


def storage_key(t: Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def storage_bytes(t: Tensor) -> int:
    return t.untyped_storage().nbytes()


@dataclass
class SavedBytes:
    """Live and peak bytes of saved activations on the device and on the host, plus the
    copy traffic between them (bytes moved out in forward, back in backward)."""

    device: int = 0
    host: int = 0
    peak_device: int = 0
    peak_host: int = 0
    to_host: int = 0
    to_device: int = 0
    _refs: dict[tuple[str, int], list[int]] = field(default_factory=dict, repr=False)

    def add(self, nbytes: int, *, host: bool = False) -> None:
        if host:
            self.host += nbytes
            self.peak_host = max(self.peak_host, self.host)
        else:
            self.device += nbytes
            self.peak_device = max(self.peak_device, self.device)

    def remove(self, nbytes: int, *, host: bool = False) -> None:
        if host:
            self.host -= nbytes
        else:
            self.device -= nbytes

    def hold(self, t: Tensor) -> _Held:
        """A handle keeping ``t`` counted as device-resident until the handle dies;
        storages shared by several handles count once."""
        key = storage_key(t)
        entry = self._refs.setdefault(key, [0, storage_bytes(t)])
        if entry[0] == 0:
            self.add(entry[1])
        entry[0] += 1
        held = _Held(t)
        weakref.finalize(held, self._release, key)
        return held

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.remove(entry[1])
            del self._refs[key]

    def reset_peaks(self) -> None:
        self.peak_device, self.peak_host = self.device, self.host


class _Held:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor


def pack_counted(stats: SavedBytes, t: Tensor) -> Tensor | _Held:
    return t if is_parameter(t) else stats.hold(t)


def unpack_counted(handle: Tensor | _Held) -> Tensor:
    return handle.tensor if isinstance(handle, _Held) else handle


@contextmanager
def count_saved_tensors(stats: SavedBytes) -> Iterator[SavedBytes]:
    """Within the block, book every saved non-parameter tensor into ``stats`` (unchanged:
    nothing is moved). Inner hooks, such as a swapped block's, take precedence."""
    hooks = torch.autograd.graph.saved_tensors_hooks(
        lambda t: pack_counted(stats, t), unpack_counted
    )
    with hooks:
        yield stats
