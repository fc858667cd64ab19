"""Who leaves the device when room is needed, and who comes in early: three policies on one
engine (``--policy``).

- ``vllm``: vLLM's multi-LoRA memory. A fixed number of adapter slots (``--max-loras``),
  each sized for the largest adapter, carved out of device memory up front; the rest is the
  KV cache. Loaded adapters leave LRU when a slot is needed; KV blocks leave LRU and know
  nothing of adapters, so blocks of evicted adapters stay until LRU reaches them.
- ``slora``: S-LoRA's unified paging. Adapters and KV blocks share the pool; the least
  recently used idle item, adapter or KV block, leaves first.
- ``elora``: ELORA's usage-dependency tree and swap cost model. Only leaves leave: a KV
  block with no cached successor, or an adapter none of whose KV blocks is still on the
  device — so no KV block is ever resident without its adapter. Leaves are ranked by
  ``Eval = LoRA_Eval x Retain_Eval`` (below); when the pool is under ``PREFETCH_BELOW``
  full, host adapters are brought in by decreasing Eval.

ELORA's cost model (the note in docs/serving.md): ``Low_lora = sum_i 1 - (1 - p_i)^BS`` is
the number of distinct adapters a batch of ``BS`` requests is expected to hold, with ``p_i``
adapter i's share of recent requests; ``LoRA_Eval_i = min(1, Now_i / Low_lora)`` where
``Now_i`` is the adapters left on the device if item i goes (an adapter's eviction lowers it
by one, a KV block's does not); ``Retain_Eval_i = cost_i x reuse_i`` with ``cost_i`` the time
to bring item i back over the link and ``reuse_i`` the chance it is needed again: for an
adapter ``1 - (1 - p_i)^BS`` (its term of ``Low_lora``), for a KV block its adapter's
chance times ``min(1, h x visit_i)``, ``h`` the share of looked-up blocks the cache has found
so far. The paper's ``Retain_Eval = cost x visit x (1 - sigmoid(seconds idle))`` is, after
a few idle seconds, least-recently-used order scaled by a constant: it kept KV blocks that
no prompt shares (``h = 0`` on S-LoRA's workload) over adapters the next batch needs, each
reload costing its request a step (``benchmarks/serving_at_scale.py``, BENCHMARKS.md).
"""

from __future__ import annotations

from collections import deque

POLICIES = ("vllm", "slora", "elora")
# ELORA's two ablations, by name (a policy holds the recent request mix of its engine, so
# each engine makes its own): the cost model alone, and the tree alone
ABLATIONS = {"elora-no-tree": {"tree": False}, "elora-lru": {"cost_model": False}}
# A link whose (adapter load / decode step) ratio for the tiny preset's rank-8 adapters on a
# 2-core CPU is about that of Llama-3-8B rank-64 adapters over PCIe 4 (docs/serving.md,
# "The link"); benchmarks/serving_policies.py prints the ratio it measured.
DEFAULT_LINK_GBPS = 1.0
PREFETCH_BELOW = 0.7  # ELORA prefetches while the pool is less full than this
RECENT = 256  # requests that make up "the recent request mix"


def make_policy(name: str):
    from legato.errors import ConfigError

    if name in ABLATIONS:
        return EloraPolicy(**ABLATIONS[name])
    if name not in POLICIES:
        raise ConfigError(
            f"--policy: must be one of {', '.join([*POLICIES, *ABLATIONS])}, got {name!r}"
        )
    return {"vllm": VllmPolicy, "slora": SloraPolicy, "elora": EloraPolicy}[name]()


class VllmPolicy:
    name = "vllm"
    separate_slots = True

    def victim(self, memory, now: float, for_adapter: str | None):
        block = next(iter(memory.blocks.idle), None)  # the idle list is in LRU order
        return None if block is None else ("kv", block)

    def evictable(self, memory, for_adapter: str | None) -> int:
        return len(memory.blocks.idle)

    def prefetch(self, memory, now: float) -> list[str]:
        return []

    def observe(self, adapter: str | None) -> None:
        pass


class SloraPolicy(VllmPolicy):
    name = "slora"
    separate_slots = False

    def victim(self, memory, now: float, for_adapter: str | None):
        blocks = memory.blocks
        block = blocks.least_recently_used_idle()
        adapters = (s for s in memory.idle_slots.values() if s.name != for_adapter)
        oldest = min(adapters, key=lambda s: (s.last_used, s.landed_at), default=None)
        if oldest is not None and (block is None or oldest.last_used < blocks.last_used[block]):
            return "adapter", oldest.name  # a tie goes to the KV block
        return None if block is None else ("kv", block)

    def evictable(self, memory, for_adapter: str | None) -> int:
        adapters = sum(len(s.blocks) for s in memory.idle_slots.values() if s.name != for_adapter)
        return len(memory.blocks.idle) + adapters


class EloraPolicy(SloraPolicy):
    """``tree=False`` ranks every idle item by Eval (no dependency order) and
    ``cost_model=False`` ranks the tree's leaves least recently used first: the two
    ablations of ``benchmarks/serving_policies.py``."""

    name = "elora"

    def __init__(self, tree: bool = True, cost_model: bool = True) -> None:
        self.tree, self.cost_model = tree, cost_model
        if not (tree and cost_model):
            self.name = "elora" + ("" if tree else "-no-tree") + ("" if cost_model else "-lru")
        self.recent: deque[str | None] = deque(maxlen=RECENT)
        self.observed = 0
        self._low: tuple[tuple[int, int], float] | None = None  # (observed, batch), Low_lora

    def observe(self, adapter: str | None) -> None:
        """A request arrived for ``adapter`` (the recent mix the cost model reads)."""
        self.recent.append(adapter)
        self.observed += 1

    def _mix(self, memory) -> tuple[dict[str | None, float], float]:
        """Each adapter's chance to be asked for by the next batch, ``1 - (1 - p_i)^BS``
        with ``p_i`` its share of the recent requests, and ``Low_lora``, their sum over
        adapters: recomputed only when the recent mix or the batch changed (the evictions
        of one step read them many times)."""
        batch = max(1, memory.pins)
        if self._low is None or self._low[0] != (self.observed, batch):
            counts: dict[str | None, int] = {}
            for name in self.recent:
                counts[name] = counts.get(name, 0) + 1
            total = max(1, len(self.recent))
            chance = {name: 1 - (1 - c / total) ** batch for name, c in counts.items()}
            low = sum(p for name, p in chance.items() if name is not None)
            self._low = (self.observed, batch), (chance, max(1e-9, low) if counts else 1.0)
        return self._low[1]

    def victim(self, memory, now: float, for_adapter: str | None):
        """The candidate of the lowest Eval; of equal ones the KV block first idle, else
        the adapter first landed (KV blocks before adapters)."""
        blocks, (chance, low) = memory.blocks, self._mix(memory)
        resident = len(memory.resident_slots)
        keep_all = min(1.0, resident / low)
        block_cost = memory.block_bytes / memory.link_bytes_per_s
        found = blocks.hits / blocks.asked if blocks.asked else 0.0  # looked-up blocks found
        kv = None
        for b in blocks.idle_leaves if self.tree else blocks.idle:
            if self.cost_model:
                reuse = chance.get(blocks.owner[b], 0.0) * min(1.0, found * blocks.visits[b])
                key = (keep_all * block_cost * reuse, blocks.idle_order(b))
            else:
                key = (blocks.last_used[b], blocks.idle_order(b))
            if kv is None or key < kv[0]:
                kv = key, b
        adapter = None
        for slot in memory.idle_slots.values():
            if slot.name == for_adapter or (self.tree and blocks.owned.get(slot.name)):
                continue  # not a leaf: its KV blocks go first
            if self.cost_model:
                cost = slot.numel * memory.element_size / memory.link_bytes_per_s
                retain = cost * chance.get(slot.name, 0.0)
                key = (min(1.0, (resident - 1) / low) * retain, slot.landed_at)
            else:
                key = (slot.last_used, slot.landed_at)
            if adapter is None or key < adapter[0]:
                adapter = key, slot.name
        if adapter is not None and (kv is None or adapter[0][0] < kv[0][0]):
            return "adapter", adapter[1]
        return None if kv is None else ("kv", kv[1])

    def prefetch(self, memory, now: float) -> list[str]:
        """Host adapters worth bringing in while the pool has room, best first."""
        blocks = memory.blocks
        if blocks.used >= PREFETCH_BELOW * blocks.num_blocks or not self.recent:
            return []
        wanted = {name for name in self.recent if name is not None}
        cold = [s for s in memory.adapters.values() if s.state == "host" and s.name in wanted]
        cold.sort(key=lambda s: -s.visits - self.recent.count(s.name))
        room, picked = int(PREFETCH_BELOW * blocks.num_blocks) - blocks.used, []
        for slot in cold:
            need = memory.blocks_of(slot.name)
            if need <= room:
                picked.append(slot.name)
                room -= need
        return picked
