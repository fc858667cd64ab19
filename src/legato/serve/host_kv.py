"""The host tier of the KV cache: cached prefix blocks the device evicted, kept in host memory
to come back over the link instead of being recomputed (vLLM's ``--swap-space``; ELORA's
pool spans device and host).

A block leaves the device only as a leaf of the usage-dependency tree (the policy's rule)
and keeps its prefix hash here, so a later request whose prefix walks past the device's
cached blocks finds the next ones on the host and copies them back in order: each block
comes in only after its parent (the previous block of the chain, or the adapter at the root)
is on the device, ELORA's "only roots of host paths come in". The tier holds at most
``capacity`` blocks, least recently stored out first. Hashes are rooted in the adapter and
its version (``blocks.prefix_root``), so a block of another adapter or an older version can
never be found; ``forget`` drops an unloaded adapter's blocks at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from legato.serve.blocks import Hash, block_hash


@dataclass
class HostBlock:
    data: Tensor | None  # the block's row of the pool, in host memory (None: accounting only)
    owner: str | None  # its adapter
    visits: int
    nbytes: int


@dataclass
class KvLoad:
    """Host blocks on their way into device ``blocks`` (the copy thread's job); ``due``:
    when the link has carried them, ``copied``: the copy thread is done with them."""

    blocks: list[int]
    hashes: list[Hash]
    parts: list[HostBlock]
    done: bool = False
    nbytes: int = field(init=False)
    due: float = 0.0
    copied: bool = False
    error = None  # a host block cannot fail to be read

    def __post_init__(self) -> None:
        self.nbytes = sum(p.nbytes for p in self.parts)

    def prepare(self, _dtype) -> None:
        pass  # already in host memory

    def copy_into(self, pool: Tensor) -> int:
        for block, part in zip(self.blocks, self.parts, strict=True):
            pool[block].copy_(part.data)
        return self.nbytes

    @property
    def landed(self) -> bool:
        return self.done

    def land(self, _pool: Tensor) -> None:
        self.done = True


class HostKV:
    """Evicted KV blocks by hash, at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[Hash, HostBlock] = OrderedDict()
        self.stored_bytes = 0  # device -> host, over the run
        self.hits = 0  # blocks brought back instead of recomputed (counted by the engine)

    def put(
        self, hashed: Hash, data: Tensor | None, owner: str | None, visits: int, nbytes: int
    ) -> None:
        if self.capacity <= 0:
            return
        self.blocks[hashed] = HostBlock(data, owner, visits, nbytes)
        self.blocks.move_to_end(hashed)
        self.stored_bytes += nbytes
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def chain(self, parent: Hash, tokens: Sequence[int], start: int, block_size: int) -> list[Hash]:
        """Hashes of the host blocks continuing ``parent``'s chain over ``tokens`` from
        position ``start``: whole blocks, never the last token (it must be computed)."""
        found = []
        for begin in range(start, (len(tokens) - 1) // block_size * block_size, block_size):
            parent = block_hash(parent, tokens[begin : begin + block_size])
            if parent not in self.blocks:
                break
            found.append(parent)
        return found

    def take(self, hashes: Sequence[Hash]) -> list[HostBlock]:
        """Remove ``hashes``' blocks (they move to the device)."""
        return [self.blocks.pop(h) for h in hashes]

    def restore(self, hashes: Sequence[Hash], parts: Sequence[HostBlock]) -> None:
        """Put back blocks ``take`` removed that could not go after all."""
        for hashed, part in zip(hashes, parts, strict=True):
            self.blocks[hashed] = part

    def forget(self, owner: str) -> None:
        for hashed in [h for h, b in self.blocks.items() if b.owner == owner]:
            del self.blocks[hashed]
