"""KV blocks: a fixed pool of equal-size blocks, reference counts and prefix caching.

A request's KV cache is a list of block ids (its block table); block ``i`` holds positions
``i * block_size`` .. ``(i + 1) * block_size - 1``. A block that fills up is *committed*
under a hash of its tokens chained to the previous block's hash and rooted in the
request's adapter and adapter version (``prefix_root``), so a later request with the same
adapter and the same prefix reuses it instead of recomputing it (vLLM's automatic prefix
caching) — and a block computed under one adapter can never be found from another, because
a LoRA on k/v projections changes the keys and values themselves. A released block keeps
its hash while nobody uses it and is only overwritten when the free list runs dry, oldest
first. Pure Python: the engine owns the tensors, this owns who may write where.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence

Hash = int


def prefix_root(adapter: str | None, version: int) -> Hash:
    """The root of every block-hash chain of requests for this adapter version."""
    return hash(("legato-prefix", adapter, version))


def block_hash(parent: Hash, tokens: Sequence[int]) -> Hash:
    return hash((parent, tuple(tokens)))


class OutOfBlocks(RuntimeError):
    """No free block and none cached to evict (the scheduler preempts on this)."""


class BlockManager:
    """Free blocks, blocks in use (reference counted) and cached blocks nobody uses."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        self.hash_of: list[Hash | None] = [None] * num_blocks
        self.by_hash: dict[Hash, int] = {}
        self.free: deque[int] = deque(range(num_blocks))
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached, refcount 0, oldest first
        self.owner: list[str | None] = [None] * num_blocks  # a committed block's adapter
        self.parent: list[int | None] = [None] * num_blocks
        self.children: list[set[int]] = [set() for _ in range(num_blocks)]  # cached, after it
        self.last_used = [0.0] * num_blocks
        self.visits = [0] * num_blocks
        self.hits = 0  # blocks found by prefix
        self.asked = 0  # whole blocks looked up by prefix (hits / asked: the hit rate)
        # idle blocks by (last use, when they became idle): a lazy heap, an entry stale
        # once its block left the idle list or came back to it later (``_idle_since``)
        self._by_age: list[tuple[float, int, int]] = []
        self._idle_since = [0] * num_blocks
        self._idled = 0
        # what ELORA's policy reads on every eviction, kept as the blocks change rather
        # than found by scanning the pool: idle blocks with no cached successor (the
        # tree's leaves, by when they became idle) and committed blocks per adapter
        self.idle_leaves: dict[int, None] = {}
        self.owned: dict[str | None, int] = {}

    @property
    def in_use(self) -> int:
        """Blocks someone holds (a request's KV, an adapter)."""
        return sum(1 for r in self.refs if r > 0)

    @property
    def used(self) -> int:
        """Blocks not on the free list (in use, or cached and idle)."""
        return self.num_blocks - len(self.free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def match(self, root: Hash, tokens: Sequence[int], now: float = 0.0) -> list[int]:
        """The cached blocks of the longest committed prefix of ``tokens`` (whole blocks,
        never the last token, which must be computed to give logits); each is now in use."""
        found, parent, size = [], root, self.block_size
        self.asked += (len(tokens) - 1) // size
        for start in range(0, (len(tokens) - 1) // size * size, size):
            parent = block_hash(parent, tokens[start : start + size])
            block = self.by_hash.get(parent)
            if block is None:
                break
            found.append(block)
        for block in found:
            self._take(block)
            self.visits[block] += 1
            self.last_used[block] = now
        self.hits += len(found)
        return found

    def allocate(self) -> int:
        """A free block (the memory policy evicts idle ones into the free list first)."""
        if not self.free:
            raise OutOfBlocks("no free block")
        block = self.free.popleft()
        self.refs[block] = 1
        return block

    def evict(self, block: int) -> None:
        """Forget the idle cached ``block``: its prefix must be recomputed from now on."""
        del self.idle[block]
        self.idle_leaves.pop(block, None)
        del self.by_hash[self.hash_of[block]]
        self.owned[self.owner[block]] -= 1
        parent = self.parent[block]
        if parent is not None:
            self.children[parent].discard(block)
            if not self.children[parent] and parent in self.idle:
                self.idle_leaves[parent] = None
        for child in self.children[block]:  # an LRU may evict a parent first
            self.parent[child] = None
        self.children[block] = set()
        self.hash_of[block] = self.owner[block] = self.parent[block] = None
        self.visits[block] = 0
        self.free.append(block)

    def is_leaf(self, block: int) -> bool:
        return not self.children[block]

    def idle_order(self, block: int) -> int:
        """When the idle ``block`` became idle, as a count (its place in ``idle``)."""
        return self._idle_since[block]

    def commit(
        self, block: int, hashed: Hash, adapter: str | None = None, parent: int | None = None,
        now: float = 0.0,
    ) -> None:  # fmt: skip
        """``block`` is full with the tokens ``hashed`` names (under ``adapter``, after the
        block ``parent``): findable from now on."""
        if self.hash_of[block] is None and hashed not in self.by_hash:
            self.hash_of[block] = hashed
            self.by_hash[hashed] = block
            self.owner[block], self.parent[block] = adapter, parent
            self.owned[adapter] = self.owned.get(adapter, 0) + 1
            self.last_used[block] = now
            if parent is not None:
                self.children[parent].add(block)
                self.idle_leaves.pop(parent, None)

    def release(self, blocks: Sequence[int]) -> None:
        """A request is done with ``blocks`` (finished, preempted or aborted)."""
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] < 0:
                raise AssertionError(f"block {block} released more often than taken")
            if self.refs[block] == 0:
                if self.hash_of[block] is None:
                    self.free.append(block)
                else:
                    self.idle[block] = None
                    if not self.children[block]:
                        self.idle_leaves[block] = None
                    self._idled += 1
                    self._idle_since[block] = self._idled
                    heapq.heappush(self._by_age, (self.last_used[block], self._idled, block))

    def least_recently_used_idle(self) -> int | None:
        """The idle block of the oldest ``last_used`` (of those, the first to become idle),
        in logarithmic time: S-LoRA's LRU over thousands of idle blocks."""
        heap = self._by_age
        while heap:
            _, since, block = heap[0]
            if block in self.idle and self._idle_since[block] == since:
                return block
            heapq.heappop(heap)
        return None

    def _take(self, block: int) -> None:
        if self.refs[block] == 0:
            self.idle.pop(block, None)
            self.idle_leaves.pop(block, None)
        self.refs[block] += 1

    def check(self) -> None:
        """Accounting invariants: every block exactly one of free, idle or in use."""
        in_use = sum(1 for r in self.refs if r > 0)
        assert in_use + len(self.free) + len(self.idle) == self.num_blocks
        assert all(self.refs[b] == 0 and self.hash_of[b] is None for b in self.free)
        assert all(self.refs[b] == 0 and self.hash_of[b] is not None for b in self.idle)
        assert all(self.hash_of[b] == h for h, b in self.by_hash.items())
        assert set(self.idle_leaves) == {b for b in self.idle if self.is_leaf(b)}
        owners = [self.owner[b] for b in self.by_hash.values()]
        assert {a: n for a, n in self.owned.items() if n} == {a: owners.count(a) for a in owners}
        for block in range(self.num_blocks):
            kids = {b for b in self.by_hash.values() if self.parent[b] == block}
            assert self.children[block] == kids
