"""The device tier: KV blocks and LoRA adapters in one pool of equal blocks, under a policy.

Every adapter lives in host memory (or, past ``max_cpu_loras``, only in its PEFT folder on
disk, read back by the copy thread); serving a request needs its adapter on the device. An
adapter is split along its rank into blocks of the KV block's size (``blocks_of``: its
factors flattened, cut into pool blocks), so adapters and KV compete for the same blocks
(S-LoRA's unified paging, ELORA's pool). Which blocks leave when room is needed is the
policy's choice (``serve/policies.py``); this module holds the state they choose from and
carries the choice out:

- an adapter is *resident* (its blocks on the device), *loading* (a copy on its way) or on
  the host; a running request pins its adapter;
- loads are asynchronous: copies go over the link one after another (one copy stream) at
  ``link_gbps``, so a copy issued at ``t`` lands at ``max(t, link free) + bytes / rate``
  on the engine's clock (``due``); a copy thread moves the bytes meanwhile (on a GPU a
  pinned-memory copy on a side stream; on a CPU both tiers are host memory — see
  docs/serving.md for the default) and a copy is seen landed only at its due time, waiting
  for the thread if it is late, so when an adapter becomes resident is a function of the
  clock (``serve/clock.py``). The engine schedules the adapter's requests once it is;
- the LoRA a step computes with is gathered from the device blocks when the load lands
  (``ResidentAdapter``; S-LoRA's kernels read the scattered blocks in place, a CPU gather
  once per load is the cheap stand-in) and dropped with them, so what is evicted really is
  gone. Nothing writes an adapter's blocks while it is resident: they are never a
  request's KV (tested under random load).

The KV blocks themselves are the ``BlockManager``'s; idle cached ones are evicted through
``BlockManager.evict`` when a policy picks them, kept on the host first when there is swap
space (``host_kv.py``), and brought back by the same copy thread as adapters.

Accounting and storage are apart: with no pool tensor (``pool=None``, ``legato serve
simulate``) the same state and decisions run on block counts and bytes alone — adapters
are sizes (``add_adapter`` of an object with ``shape`` and ``numel``), nothing is copied,
and a resident adapter's slot stands for its factors (the step-time model reads its rank).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from legato.errors import ConfigError
from legato.lora.adapter import AdapterShape, LoraAdapter
from legato.lora.peft_io import WEIGHTS_FILE, peft_key
from legato.serve.blocks import BlockManager
from legato.serve.clock import WallClock
from legato.serve.decisions import NullLog
from legato.serve.host_kv import HostKV, KvLoad

COPY_TIMEOUT_S = 120.0  # no host-to-device copy of one adapter or KV load takes longer
IDLE_POLL_S = 0.001  # an engine with nothing to run and no copy on its way looks again


@dataclass
class AdapterSlot:
    """One adapter's place in the pool."""

    name: str
    host: Tensor | None  # every factor flattened, in the pool's dtype; None: on disk only
    layout: list[tuple[str, tuple[int, ...], tuple[int, ...]]]  # path, A shape, B shape
    shape: AdapterShape
    numel: int  # elements of ``host``
    source: Path | None = None  # its PEFT folder: the host copy may go and be read again
    blocks: list[int] = field(default_factory=list)  # device blocks, when resident/loading
    state: str = "host"  # "host" | "loading" | "resident"
    pins: int = 0  # running requests using it
    visits: int = 0
    last_used: float = 0.0
    resident: ResidentAdapter | None = None
    disk_reads: int = 0
    error: str | None = None  # its last load failed (its folder unreadable): why
    due: float = 0.0  # when its copy has crossed the link
    copied: bool = False  # the copy thread is done with its load
    landed_at: int = 0  # the pool's count of landings when it last landed (ties: first)

    @property
    def landed(self) -> bool:
        return self.state != "loading"

    @property
    def in_host_memory(self) -> bool:
        """Its factors are in host memory (a load reading them from disk counts already)."""
        return self.host is not None or self.state == "loading"

    def prepare(self, dtype: torch.dtype) -> None:
        """Read the factors back from disk when the host copy was dropped (before the
        link's clock starts: disk, then link)."""
        if self.host is None:
            self.host = read_flat(self.source, self.layout, dtype)
            self.disk_reads += 1

    def copy_into(self, pool: Tensor) -> int:
        """The copy thread's work: the host factors into the device blocks; bytes moved."""
        width = pool.shape[1]
        for i, block in enumerate(self.blocks):
            chunk = self.host[i * width : (i + 1) * width]
            pool[block, : chunk.numel()] = chunk
        return self.host.numel() * self.host.element_size()

    def land(self, pool: Tensor | None) -> None:
        if self.state == "loading":
            self.state = "resident"
            self.resident = self if pool is None else ResidentAdapter(self, pool)


def read_flat(folder: Path, layout, dtype: torch.dtype) -> Tensor:
    """An adapter's factors read back from its PEFT folder, flattened as ``add_adapter``
    lays them out (the disk tier under vLLM's ``--max-cpu-loras``)."""
    state = load_file(Path(folder) / WEIGHTS_FILE)
    parts = []
    for path, _, _ in layout:
        parts += [state[peft_key(path, "A")].reshape(-1), state[peft_key(path, "B")].reshape(-1)]
    return torch.cat(parts).to(dtype).contiguous()


class ResidentAdapter:
    """The factors of an adapter gathered from its device blocks (what a step computes
    with): the ``factors``/``shape`` interface of ``LoraAdapter``. A copy, freed with the
    blocks, so a resident adapter costs its blocks plus this copy of host memory."""

    def __init__(self, slot: AdapterSlot, pool: Tensor) -> None:
        flat = pool[slot.blocks].reshape(-1)[: slot.numel]
        self.name, self.shape = slot.name, slot.shape
        self._factors: dict[str, tuple[Tensor, Tensor]] = {}
        offset = 0
        for path, a_shape, b_shape in slot.layout:
            a_size, b_size = a_shape[0] * a_shape[1], b_shape[0] * b_shape[1]
            a = flat[offset : offset + a_size].view(a_shape)
            b = flat[offset + a_size : offset + a_size + b_size].view(b_shape)
            self._factors[path] = (a, b)
            offset += a_size + b_size

    def factors(self, path: str) -> tuple[Tensor, Tensor] | None:
        return self._factors.get(path)


class DeviceMemory:
    """The pool (the KV cache tensor, seen as ``[blocks, block_elems]``), its adapters and
    the copy thread; ``policy`` decides evictions and prefetches."""

    def __init__(
        self,
        blocks: BlockManager,
        pool: Tensor | None,
        policy,
        link_gbps: float,
        max_loras: int = 4,
        host_kv_blocks: int = 0,
        max_cpu_loras: int = 0,
        *,
        clock=None,
        log=None,
        block_bytes: int = 0,
        element_size: int = 2,
    ) -> None:
        """``pool``: the device blocks' tensor, or None to keep the accounting only (then
        ``block_bytes`` and ``element_size`` say how large a block and an element are)."""
        if not link_gbps > 0:
            raise ConfigError(f"--link-gbps: must be > 0, got {link_gbps}")
        self.blocks, self.policy = blocks, policy
        self.clock, self.log = clock or WallClock(), log or NullLog()
        self.pool = None if pool is None else pool.view(pool.shape[0], -1)
        if self.pool is not None:
            element_size = self.pool.element_size()
            block_bytes = self.pool.shape[1] * element_size
        self.block_bytes, self.element_size = block_bytes, element_size
        self.block_elems = block_bytes // element_size
        self.link_bytes_per_s = link_gbps * 1e9 / 8
        self.link_free = 0.0  # when the link has carried every copy issued so far
        self.in_flight: deque = deque()  # copies issued, not yet landed, in link order
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras  # host copies kept (0: every adapter's)
        self.region: list[int] | None = None  # vLLM's adapter slots, once reserved
        self.slot_blocks: int | None = None
        self.adapters: dict[str, AdapterSlot] = {}
        self.resident_slots: dict[str, AdapterSlot] = {}  # those on the device, by name
        # resident and pinned by no request (the policies' candidates, kept as pins change
        # rather than found by scanning every adapter on each eviction), and all pins
        self.idle_slots: dict[str, AdapterSlot] = {}
        self.pins = 0
        self.landings = 0
        self.swapped_in_bytes = 0  # adapters and KV blocks, host -> device
        self.loads = 0  # adapter copies started (on demand or prefetched)
        self.host_kv = HostKV(host_kv_blocks)
        self._copies: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._thread = None
        if self.pool is not None:
            self._thread = threading.Thread(target=self._copy_loop, name="legato-swap",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    # ------------------------------------------------------------------ adapters

    def add_adapter(self, name: str, adapter: LoraAdapter, source: Path | None = None) -> None:
        """Keep ``adapter`` on the host (replacing a previous one of the name, if idle);
        with its PEFT folder as ``source`` the host copy may be dropped (``max_cpu_loras``)
        and read again from there when the adapter is next needed."""
        old = self.adapters.get(name)
        if old is not None:
            self._drop_adapter(old)
        if self.pool is None:  # a size: the accounting only
            self.adapters[name] = AdapterSlot(name, None, [], adapter.shape, adapter.numel)
            return
        layout, parts = [], []
        for path, a, b in adapter.named_factors():
            layout.append((path, tuple(a.shape), tuple(b.shape)))
            parts += [a.detach().reshape(-1), b.detach().reshape(-1)]
        host = torch.cat(parts).to(self.pool.dtype).contiguous()
        self.adapters[name] = AdapterSlot(name, host, layout, adapter.shape, host.numel(), source)
        self._trim_host(keep=name)

    def _trim_host(self, keep: str | None = None) -> None:
        """vLLM's CPU LRU: past ``max_cpu_loras`` host copies, drop those of the least
        recently used adapters that are neither on the device nor on their way there and
        can be read again from disk."""
        if self.max_cpu_loras <= 0:
            return
        held = [s for s in self.adapters.values() if s.in_host_memory]
        spare = sorted((s for s in held if s.state == "host" and s.source is not None
                        and s.name != keep and not s.pins), key=lambda s: s.last_used)  # fmt: skip
        for slot in spare[: max(0, len(held) - self.max_cpu_loras)]:
            slot.host = None

    def host_copies(self) -> int:
        return sum(1 for s in self.adapters.values() if s.in_host_memory)

    def disk_reads(self) -> int:
        return sum(s.disk_reads for s in self.adapters.values())

    def remove_adapter(self, name: str) -> None:
        self._drop_adapter(self.adapters.pop(name))

    def reserve_slots(self, min_elements: int = 0) -> int:
        """vLLM's split: ``max_loras`` slots, each of the largest adapter's blocks (or of
        ``min_elements``, vLLM's ``--max-lora-rank`` room, if larger), taken out of the pool
        for good; the blocks reserved."""
        largest = max((self.blocks_of(n) for n in self.adapters), default=0)
        per_slot = max(largest, self.blocks_for(min_elements))
        if per_slot == 0:
            raise ConfigError(
                "--max-lora-rank: the vllm policy sizes its LoRA slots by the largest adapter "
                "given at start or by --max-lora-rank; with no adapters, give --max-lora-rank"
            )
        self.slot_blocks = per_slot
        if self.max_loras * per_slot >= self.blocks.num_blocks:
            raise ConfigError(
                f"--max-loras: {self.max_loras} slots of {per_slot} blocks leave no KV blocks "
                f"of the {self.blocks.num_blocks} in --num-blocks"
            )
        self.region = [self.blocks.allocate() for _ in range(self.max_loras * per_slot)]
        return len(self.region)

    def blocks_of(self, name: str) -> int:
        return self.blocks_for(self.adapters[name].numel)

    def blocks_for(self, elements: int) -> int:
        """Pool blocks that ``elements`` adapter elements take (an adapter cut into blocks)."""
        return -(-elements // self.block_elems)

    def resident(self, name: str | None) -> ResidentAdapter | None:
        return None if name is None else self.adapters[name].resident

    def request(self, name: str, now: float) -> bool:
        """True if ``name`` is on the device; else start loading it if room can be made
        (False until the copy lands)."""
        self.collect(now)
        slot = self.adapters[name]
        slot.last_used = now
        if slot.state == "resident":
            return True
        if slot.state == "host" and slot.error is None:
            self._load(slot, now)
        return False

    def pin(self, name: str | None, now: float) -> None:
        if name is not None:
            slot = self.adapters[name]
            slot.pins, slot.visits, slot.last_used = slot.pins + 1, slot.visits + 1, now
            self.pins += 1
            self.idle_slots.pop(name, None)

    def unpin(self, name: str | None) -> None:
        if name is not None:
            slot = self.adapters[name]
            slot.pins -= 1
            self.pins -= 1
            if not slot.pins and slot.state == "resident":
                self.idle_slots[name] = slot

    def _load(self, slot: AdapterSlot, now: float, evict: bool = True) -> bool:
        need = self.blocks_of(slot.name)
        if self.region is not None:  # a slot of vLLM's: the LRU idle adapter leaves
            while len(self.region) < need:
                if not self.idle_slots or not evict:
                    return False
                idle = self.idle_slots.values()
                self._drop_adapter(min(idle, key=lambda s: (s.last_used, s.landed_at)))
            slot.blocks = [self.region.pop() for _ in range(need)]
        else:
            if not (self.make_room(need, now, for_adapter=slot.name) if evict
                    else len(self.blocks.free) >= need):  # fmt: skip
                return False
            slot.blocks = [self.blocks.allocate() for _ in range(need)]
        slot.state = "loading"
        self._trim_host(keep=slot.name)  # room for the copy read from disk, if it is
        self.log.note("load", [slot.name, slot.blocks])
        self.loads += 1
        self._issue(slot, slot.numel * self.element_size, now)
        return True

    def _drop_adapter(self, slot: AdapterSlot) -> None:
        if slot.state == "loading":
            self.wait(slot)
        if self.region is not None:
            self.region.extend(slot.blocks)
        elif slot.blocks:
            self.blocks.release(slot.blocks)
        slot.blocks, slot.state, slot.resident = [], "host", None
        self.resident_slots.pop(slot.name, None)
        self.idle_slots.pop(slot.name, None)
        self._trim_host()

    # ------------------------------------------------------------------ room

    def make_room(self, need: int, now: float, for_adapter: str | None = None) -> bool:
        """Evict what the policy picks until ``need`` blocks are free (False, evicting
        nothing more, when it cannot)."""
        while len(self.blocks.free) < need:
            victim = self.policy.victim(self, now, for_adapter)
            if victim is None:
                return False
            kind, what = victim
            self.log.note("evict_" + kind, what)
            if kind == "kv":
                self._swap_out(what)
                self.blocks.evict(what)
            else:
                self._drop_adapter(self.adapters[what])
        return True

    def evictable(self, for_adapter: str | None = None) -> int:
        """Blocks ``make_room`` could free now (under this policy)."""
        return len(self.blocks.free) + self.policy.evictable(self, for_adapter)

    def tick(self, now: float) -> None:
        """Land finished copies; let the policy prefetch."""
        self.collect(now)
        for name in self.policy.prefetch(self, now):
            slot = self.adapters[name]
            if slot.state == "host":
                self._load(slot, now, evict=False)

    def adapter_blocks(self) -> int:
        """Blocks adapters hold (vLLM's reserved slots included)."""
        if self.region is not None:  # the slots hold their blocks whether filled or not
            return self.max_loras * (self.slot_blocks or 0)
        return sum(len(s.blocks) for s in self.adapters.values())

    def kv_without_adapter(self) -> float:
        """The share of device KV blocks held for an adapter that is not resident (useless
        until it comes back; vLLM's split wastes ~40% in ELORA's traces)."""
        held = sum(n for owner, n in self.blocks.owned.items() if owner is not None)
        if not held:
            return 0.0
        gone = sum(n for owner, n in self.blocks.owned.items() if owner is not None
                   and owner not in self.resident_slots)  # fmt: skip
        return gone / held

    # ------------------------------------------------------------------ copies

    def _swap_out(self, block: int) -> None:
        """Keep an evicted cached block on the host, when there is a host tier (a clone of
        its row; on a GPU a device-to-host copy the block's reuse would wait for)."""
        if self.host_kv.capacity:
            blocks = self.blocks
            row = None if self.pool is None else self.pool[block].clone()
            self.host_kv.put(blocks.hash_of[block], row, blocks.owner[block],
                             blocks.visits[block], self.block_bytes)  # fmt: skip
            self.log.note("kv_out", block)

    def swap_in(self, load: KvLoad, now: float) -> None:
        """Copy ``load``'s host blocks into its device blocks, asynchronously."""
        self.log.note("kv_in", load.blocks)
        self._issue(load, load.nbytes, now)

    def _issue(self, job, nbytes: int, now: float) -> None:
        """Send ``job`` over the link: due when the copies before it and its own bytes
        have crossed (see the module docstring); the thread copies the bytes meanwhile."""
        job.due = self.link_free = max(now, self.link_free) + nbytes / self.link_bytes_per_s
        job.copied = self._thread is None  # nothing to copy without tensors
        self.swapped_in_bytes += nbytes
        self.in_flight.append(job)
        if self._thread is not None:
            self._copies.put(job)

    def next_landing(self, now: float) -> float:
        """When the next copy lands (a moment from ``now`` when none is on its way)."""
        return self.in_flight[0].due if self.in_flight else now + IDLE_POLL_S

    def collect(self, now: float) -> None:
        """Land every copy due by ``now`` (an adapter becomes resident, a KV load done)."""
        while self.in_flight and self.in_flight[0].due <= now:
            self._land(self.in_flight[0])

    def wait(self, job, timeout_s: float = COPY_TIMEOUT_S) -> None:
        """Land ``job`` (an adapter's or a KV load's copy) now, before its due time (its
        blocks are about to be reused); a RuntimeError, not a hang, if the copy thread died
        or the copy takes longer than ``timeout_s``."""
        if not job.landed:
            self._land(job, timeout_s)

    def _land(self, job, timeout_s: float = COPY_TIMEOUT_S) -> None:
        self._await_copy(job, timeout_s)
        if job in self.in_flight:
            self.in_flight.remove(job)
        if isinstance(job, AdapterSlot) and job.error:
            job.state = "host"  # landed nothing: give its blocks back
            self._drop_adapter(job)
            return
        self.log.note("landed", job.name if isinstance(job, AdapterSlot) else job.blocks)
        job.land(self.pool)
        if isinstance(job, AdapterSlot):  # a copy read from disk is a host copy again
            self.resident_slots[job.name] = job
            self.landings += 1
            job.landed_at = self.landings
            if not job.pins:
                self.idle_slots[job.name] = job
            self._trim_host(keep=job.name)

    def _await_copy(self, job, timeout_s: float) -> None:
        """Until the copy thread is done with ``job`` (real seconds: the physical copy,
        not the link's modelled time)."""
        deadline = time.monotonic() + timeout_s
        while not job.copied:
            try:
                self._done.get(timeout=0.001).copied = True
                continue
            except queue.Empty:
                pass
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = "the copy thread died" if not self._thread.is_alive() else "timed out"
                raise RuntimeError(f"waiting for the copy of {job!r}: {why}")

    def _copy_loop(self) -> None:
        while True:
            job = self._copies.get()
            try:
                job.prepare(self.pool.dtype)
            except Exception as exc:  # a folder gone or corrupt: that adapter fails, not all
                job.error = f"cannot read adapter {job.name!r} from {job.source}: {exc}"
                self._done.put(job)
                continue
            job.copy_into(self.pool)
            self._done.put(job)
