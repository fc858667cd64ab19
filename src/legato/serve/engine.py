"""The serving engine: continuous batching of many adapters' requests over a paged KV cache.

Each ``step()`` builds one batch under a token budget (``max_num_batched_tokens``, vLLM's
name): first every running request's next tokens — one decode token, or the next chunk of
a prompt that did not fit one step (chunked prefill) — then waiting requests in arrival
order while the budget, ``max_num_seqs`` and the free blocks allow. A request's known
tokens are its prompt and what it generated; those not yet in the cache are its new rows.
When a running request needs a block and none is left, the newest running request is
preempted (its blocks released, to be recomputed when it is admitted again — vLLM's
recompute preemption); blocks it had filled stay in the prefix cache, so recomputation is
often a cache hit. Requests of different adapters share the batch (``paged_model``).

Time: the engine reads its ``clock`` once when a step begins and once when the batch is
done, and decides everything of the step at those instants (``serve/clock.py``); the
batch runs on a backend — the model's weights and paged cache (``TorchBackend``), or a
modelled device whose step times a step-time source gives (``serve/simulate.py``), which
is how ``legato serve simulate`` runs this very scheduler. With a ``decision_log`` every
step's decisions are recorded (``serve/decisions.py``).

Thread-safety: ``add`` and ``abort`` may be called from another thread (the HTTP server's
event loop) while one thread runs ``step``; a lock guards the queues. A request reports
progress through its ``on_update`` callback, called on the stepping thread.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from legato.data.tokenizer import Tokenizer
from legato.errors import ConfigError
from legato.lora.adapter import AdapterShape, LoraAdapter, linear_layers
from legato.models.transformer import Transformer
from legato.serve.blocks import BlockManager, block_hash, prefix_root
from legato.serve.clock import WallClock
from legato.serve.decisions import NullLog
from legato.serve.host_kv import KvLoad
from legato.serve.memory import DeviceMemory
from legato.serve.paged_model import PagedKVCache, PagedModel, StepRows
from legato.serve.policies import DEFAULT_LINK_GBPS, make_policy
from legato.serve.sampling import RequestError, SamplingParams, next_token

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass
class EngineConfig:
    block_size: int = 16
    num_blocks: int = 256  # device blocks, shared by KV and adapters (but under vllm)
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_queue: int = 256  # waiting requests beyond this are refused (HTTP 429)
    policy: Any = "elora"  # vllm | slora | elora, or a policy object (serve/policies.py)
    max_loras: int = 4  # vllm: adapter slots on the device
    max_lora_rank: int = 0  # vllm: slots hold at least a rank this large (0: largest given)
    device_memory: int = 0  # bytes of the device pool; > 0 sets num_blocks from the model
    swap_space: int = 0  # bytes of host memory for evicted KV blocks (0: they are dropped)
    max_cpu_loras: int = 0  # adapters kept in host memory (0: all); others read from disk
    link_gbps: float = DEFAULT_LINK_GBPS  # host -> device adapter copies


@dataclass(eq=False)  # a request is itself: queue membership by identity, not by fields
class Request:
    id: str
    adapter: str | None
    prompt: list[int]
    params: SamplingParams
    arrival_s: float
    on_update: Callable[[Request], None] | None = None
    output: list[int] = field(default_factory=list)
    state: str = WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # known tokens whose keys and values are in the cache
    committed: int = 0  # blocks registered in the prefix cache
    chain: int = 0  # hash of the last committed block (or the adapter's root)
    kv_load: KvLoad | None = None  # host blocks of its prefix on their way in
    text: str = ""  # the output decoded, cut at a stop string
    first_token_s: float | None = None
    preemptions: int = 0
    generator: torch.Generator | None = None
    error: str | None = None  # set when the engine failed under the request
    seq: int = 0  # the engine's count of requests added before this one (the log's id)

    @property
    def known(self) -> list[int]:
        return self.prompt + self.output

    @property
    def known_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def tokens(self, start: int, end: int) -> list[int]:
        """``known[start:end]`` without building ``known`` (a step reads a few tokens of
        a long request)."""
        cut = len(self.prompt)
        if end <= cut:
            return self.prompt[start:end]
        if start >= cut:
            return self.output[start - cut : end - cut]
        return self.prompt[start:] + self.output[: end - cut]


class TorchBackend:
    """What a real step runs on: the model's weights and its paged KV cache (whose tensor
    is the device pool), and the sampler."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.cache = PagedKVCache(model, config.num_blocks, config.block_size)
        self.runner = PagedModel(model, self.cache)
        self.pool: torch.Tensor | None = self.cache.kv
        self.block_bytes = self.cache.bytes_per_block
        self.element_size = self.pool.element_size()
        self.max_model_len = model.spec.seq_len
        self.model, self.vocab = model, tokenizer.vocab_size

    def rank_elements(self, rank: int) -> int:
        """Elements of a rank-``rank`` adapter on every linear layer of the decoder
        blocks: the room vLLM gives each LoRA slot for ``--max-lora-rank``."""
        layers = linear_layers(self.model.model.layers)
        return rank * sum(layer.in_features + layer.out_features for layer in layers.values())

    def step(self, parts: Sequence[StepRows]) -> torch.Tensor:
        return self.runner.step(parts)

    def sample(self, row: torch.Tensor, request: Request) -> int:
        return next_token(row[: self.vocab], request.params, request.generator)


class Engine:
    """``add`` requests, call ``step`` until ``has_work`` is False (or run a loop thread)."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        adapters: dict[str, LoraAdapter] | None = None,
        config: EngineConfig | None = None,
        model_name: str = "legato",
        sources: dict[str, Path] | None = None,
        *,
        clock=None,
        decision_log=None,
        request_log=None,
    ) -> None:
        """``sources``: the PEFT folder of each adapter read from one, so that its host
        copy may be dropped under ``max_cpu_loras`` and read again when needed. ``model``
        is a ``Transformer``, or a backend of a modelled device (``simulate.py``; its
        adapters are ``simulate.AdapterSize``s, sizes without factors). ``clock``: the
        wall clock unless given; ``decision_log``: a ``decisions.DecisionLog``;
        ``request_log``: a ``request_log.RequestLog``."""
        config = config or EngineConfig()
        if isinstance(model, torch.nn.Module):
            config = _sized(config, model)
            self.backend = TorchBackend(model, tokenizer, config)
            self.cache = self.backend.cache
        else:
            self.backend = model
        self.config, self.clock = config, clock or WallClock()
        self.log = decision_log or NullLog()
        self.request_log = request_log
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.max_model_len = self.backend.max_model_len
        adapters, sources = dict(adapters or {}), dict(sources or {})
        # what is served (the factors themselves live in ``memory``, on the host or disk)
        self.adapters: dict[str, AdapterShape] = {n: a.shape for n, a in adapters.items()}
        self.versions: dict[str, int] = dict.fromkeys(self.adapters, 0)
        self.blocks = BlockManager(self.config.num_blocks, self.config.block_size)
        policy = self.config.policy
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        cpu, slots = self.config.max_cpu_loras, self.config.max_loras
        if cpu and self.policy.separate_slots and cpu < slots:  # vLLM's rule
            raise ConfigError(f"--max-cpu-loras: must be >= --max-loras ({slots}), got {cpu}")
        host_blocks = self.config.swap_space // self.backend.block_bytes
        self.memory = DeviceMemory(
            self.blocks, self.backend.pool, self.policy, self.config.link_gbps,
            self.config.max_loras, host_blocks, self.config.max_cpu_loras,
            clock=self.clock, log=self.log, block_bytes=self.backend.block_bytes,
            element_size=self.backend.element_size,
        )  # fmt: skip
        for name, adapter in adapters.items():
            self.memory.add_adapter(name, adapter, sources.get(name))
        if self.policy.separate_slots:
            self.memory.reserve_slots(self.backend.rank_elements(self.config.max_lora_rank))
        self.kv_blocks = self.config.num_blocks - (len(self.memory.region or ()))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.lock = threading.Lock()
        self.steps = 0  # steps that ran a batch
        self.attempts = 0  # calls of ``step`` (the decision log's records)
        self.added = 0
        self.peak_batch = 0  # the most requests one step has run

    # ------------------------------------------------------------------ adapters

    def load_adapter(self, name: str, adapter: LoraAdapter, source: Path | None = None) -> None:
        """Serve ``adapter`` (read from the PEFT folder ``source``, if it was) as ``name``; a
        reload is a new version (old cached prefixes of the name are never found again)."""
        with self.lock:
            if name in self.adapters and any(
                r.adapter == name for r in (*self.waiting, *self.running)
            ):
                raise RequestError(f"lora_name: {name!r} has requests in flight", 400, "lora_name")
            slot_blocks = self.memory.slot_blocks
            need = self.memory.blocks_for(
                sum(a.numel() + b.numel() for _, a, b in adapter.named_factors())
            )
            if slot_blocks is not None and need > slot_blocks:
                raise RequestError(
                    f"lora_path: the adapter needs {need} blocks, larger than a LoRA slot "
                    f"({slot_blocks})", 400, "lora_path",
                )  # fmt: skip
            self.memory.add_adapter(name, adapter, source)
            self._forget_prefixes(name)
            self.versions[name] = self.versions.get(name, -1) + 1
            self.adapters[name] = adapter.shape

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            if name not in self.adapters:
                raise RequestError(f"lora_name: no adapter named {name!r}", 404, "lora_name")
            if any(r.adapter == name for r in (*self.waiting, *self.running)):
                raise RequestError(f"lora_name: {name!r} has requests in flight", 400, "lora_name")
            del self.adapters[name]
            self._forget_prefixes(name)
            self.memory.remove_adapter(name)

    def _forget_prefixes(self, name: str) -> None:
        """Evict the idle cached blocks of ``name``: after an unload or a reload (a new
        version) nothing can match them, and none may outlive its adapter."""
        for block in [b for b in self.blocks.idle if self.blocks.owner[b] == name]:
            self.blocks.evict(block)
        self.memory.host_kv.forget(name)

    def fail_all(self, reason: str) -> None:
        """End every request (the step raised): each client gets its answer so far."""
        with self.lock:
            for request in [*self.running, *self.waiting]:
                if request in self.waiting:
                    self.waiting.remove(request)
                self._finish(request, "abort")
                request.error = reason

    # ------------------------------------------------------------------ requests

    def add(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        adapter: str | None = None,
        on_update: Callable[[Request], None] | None = None,
        arrival_s: float | None = None,
    ) -> Request:
        """Queue a request (that arrived at ``arrival_s`` on the engine's clock: now,
        unless a replay says when); a RequestError (404 unknown adapter, 400 too long, 429
        queue full) refuses it with nothing allocated."""
        if adapter is not None and adapter not in self.adapters:
            raise RequestError(f"model: the model {adapter!r} does not exist", 404, "model")
        if not prompt:
            raise RequestError("prompt: must not be empty", 400, "prompt")
        vocab = self.tokenizer.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt: token ids must be in [0, {vocab})", 400, "prompt")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:  # the prompt's field when it leaves no room by itself
            field = "prompt" if len(prompt) >= self.max_model_len else "max_tokens"
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {total} tokens ({len(prompt)} in the prompt, "
                f"{params.max_tokens} in the completion). Please reduce the length of the "
                f"prompt or max_tokens.", 400, field,
            )  # fmt: skip
        room = self.kv_blocks - (self.memory.blocks_of(adapter) if adapter and
                                 not self.policy.separate_slots else 0)  # fmt: skip
        if self.blocks.blocks_for(total) > room:
            raise RequestError(
                f"max_tokens: {total} tokens need {self.blocks.blocks_for(total)} KV blocks, "
                f"the device has room for {room}", 400, "max_tokens",
            )  # fmt: skip
        with self.lock:
            if len(self.waiting) >= self.config.max_queue:
                raise RequestError("the server is overloaded; retry later", 429)
            arrival = self.clock.now() if arrival_s is None else arrival_s
            request = Request(f"cmpl-{uuid.uuid4().hex}", adapter, list(prompt), params,
                              arrival, on_update, seq=self.added)  # fmt: skip
            self.added += 1
            request.generator = params.generator()
            self.waiting.append(request)
            self.policy.observe(adapter)
            self.log.note("arrived", request.seq)
        return request

    def abort(self, request: Request) -> None:
        """Stop ``request`` (a client went away): its blocks are freed at once."""
        with self.lock:
            if request.state == FINISHED:
                return
            if request in self.waiting:
                self.waiting.remove(request)
            self._finish(request, "abort")  # out of the running batch, its adapter unpinned

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one step

    def step(self, now: float | None = None) -> list[Request]:
        """Run one batch (begun at ``now`` on the engine's clock: read here unless a
        replay's driver read it when it added the arrivals); the requests that got a token
        or finished. With nothing to run it waits for the next copy to land."""
        start = self.clock.now() if now is None else now
        self.attempts += 1
        with self.lock:
            parts, scheduled = self._schedule(start)
            if not parts:
                self.memory.tick(start)
                self.log.end_step(self.attempts - 1, start, start)
        if not parts:
            if self.waiting:  # adapters or KV blocks are being copied in: nothing to run yet
                self.clock.sleep_until(self.memory.next_landing(start))
            return []
        if self.log.recording:
            batch = zip(scheduled, parts, strict=True)
            self.log.note("batch", [[r.seq, len(p.tokens), p.start] for r, p in batch])
        rows = self.backend.step(parts)
        self.steps += 1
        self.peak_batch = max(self.peak_batch, len(parts))
        changed = []
        now = self.clock.now()
        with self.lock:
            self.memory.tick(now)
            for request, part, row in zip(scheduled, parts, rows, strict=True):
                if request.state != RUNNING:  # aborted while the batch ran
                    continue
                request.cached += len(part.tokens)
                self._commit_full_blocks(request, now)
                if request.cached == request.known_len:
                    self._append(request, row, now)
                    changed.append(request)
            self.log.end_step(self.attempts - 1, start, now)
        for request in changed:
            if request.on_update is not None:
                request.on_update(request)
        return changed

    def _schedule(self, now: float) -> tuple[list[StepRows], list[Request]]:
        budget = self.config.max_num_batched_tokens
        parts, scheduled = [], []
        for request in list(self.running):
            if budget == 0:
                break
            if request.state != RUNNING:  # preempted below to make room for an older one
                continue
            n = min(request.known_len - request.cached, budget)
            if not self._reserve(request, request.cached + n, now, preempt=True, keep=scheduled):
                continue
            parts.append(self._rows(request, n))
            scheduled.append(request)
            budget -= n
        for request in list(self.waiting):
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if request.kv_load is not None:  # pinned, holding its blocks, since the load began
                if not request.kv_load.done:
                    continue
                self._land_kv(request, now)
            else:
                if request.adapter is not None and not self.memory.request(request.adapter, now):
                    failed = self.memory.adapters[request.adapter].error
                    if failed:  # its folder could not be read: this request ends, not all
                        self.waiting.remove(request)
                        request.error = failed
                        self._finish(request, "abort")
                    continue  # its adapter is on its way (or no room yet): others go first
                self.memory.pin(request.adapter, now)
                if not request.blocks:
                    self._match_prefix(request, now)
                    if self._swap_in(request, now):
                        continue  # its next prefix blocks are coming back from the host
            n = min(request.known_len - request.cached, budget)
            if not self._reserve(request, request.cached + n, now, preempt=False):
                self._drop_blocks(request)  # a waiting request holds no blocks
                self.memory.unpin(request.adapter)
                self._release_landed(now)  # (but while its KV comes in): the head needs room
                break
            self.waiting.remove(request)
            request.state = RUNNING
            self.running.append(request)
            self.log.note("admitted", request.seq)
            parts.append(self._rows(request, n))
            scheduled.append(request)
            budget -= n
        return parts, scheduled

    def _rows(self, request: Request, n: int) -> StepRows:
        tokens = request.tokens(request.cached, request.cached + n)
        return StepRows(
            tokens, request.cached, request.blocks, self.memory.resident(request.adapter)
        )

    def _match_prefix(self, request: Request, now: float) -> None:
        request.chain = prefix_root(request.adapter, self.versions.get(request.adapter, 0))
        request.blocks = self.blocks.match(request.chain, request.known, now)
        size = self.config.block_size
        for i in range(len(request.blocks)):
            request.chain = block_hash(request.chain, request.known[i * size : (i + 1) * size])
        request.committed = len(request.blocks)
        request.cached = request.committed * size

    def _swap_in(self, request: Request, now: float) -> bool:
        """Start copying the host blocks that continue ``request``'s cached prefix into
        fresh device blocks (True), if there are any and room can be made for them."""
        host = self.memory.host_kv
        start = len(request.blocks) * self.config.block_size
        hashes = host.chain(request.chain, request.known, start, self.config.block_size)
        if not hashes:
            return False
        parts = host.take(hashes)
        if not self.memory.make_room(len(hashes), now, for_adapter=request.adapter):
            host.restore(hashes, parts)
            return False
        fresh = [self.blocks.allocate() for _ in hashes]
        request.blocks += fresh
        request.kv_load = KvLoad(fresh, hashes, parts)
        self.memory.swap_in(request.kv_load, now)
        return True

    def _land_kv(self, request: Request, now: float) -> None:
        """The blocks ``_swap_in`` brought back are cached again, after the request's
        device prefix, as if this request had computed them."""
        load, request.kv_load = request.kv_load, None
        parent = request.blocks[request.committed - 1] if request.committed else None
        for block, hashed, part in zip(load.blocks, load.hashes, load.parts, strict=True):
            if parent is not None and self.blocks.hash_of[parent] is None:
                parent = None  # another request cached that block meanwhile: ours is private
            self.blocks.commit(block, hashed, request.adapter, parent, now)
            self.blocks.visits[block] = part.visits + 1
            parent = block
        self.memory.host_kv.hits += len(load.blocks)
        request.chain = load.hashes[-1]
        request.committed += len(load.blocks)
        request.cached = request.committed * self.config.block_size

    def _release_landed(self, now: float) -> None:
        """Waiting requests whose host blocks have landed cache them and let go: blocks
        held by requests that cannot run yet would starve the head of the queue."""
        for request in self.waiting:
            if request.kv_load is not None and request.kv_load.done:
                self._land_kv(request, now)
                self._drop_blocks(request)
                self.memory.unpin(request.adapter)

    def _reserve(
        self, request: Request, tokens: int, now: float, preempt: bool,
        keep: Sequence[Request] = (),
    ) -> bool:  # fmt: skip
        """Blocks for ``tokens`` positions of ``request``; with ``preempt``, the newest
        running requests not in this step's batch (``keep``) give theirs up first, then
        ``request`` itself (else False and nothing changes)."""
        need = self.blocks.blocks_for(tokens) - len(request.blocks)
        if need <= 0:  # most steps of most requests: a decode token in a block it holds
            return True
        while need > len(self.blocks.free) and need > self.memory.evictable():
            victims = [r for r in self.running if r is not request and r not in keep]
            if not preempt or not victims:
                if request.state == RUNNING and preempt:
                    self._preempt(request)
                return False
            self._preempt(victims[-1])
        if not self.memory.make_room(need, now):
            return False
        for _ in range(need):
            request.blocks.append(self.blocks.allocate())
        return True

    def _preempt(self, request: Request) -> None:
        self.log.note("preempted", request.seq)
        self.running.remove(request)
        self.memory.unpin(request.adapter)
        self._drop_blocks(request)
        request.state = WAITING
        request.preemptions += 1
        self.waiting.appendleft(request)

    def _drop_blocks(self, request: Request) -> None:
        self.blocks.release(request.blocks)
        request.blocks, request.cached, request.committed = [], 0, 0

    def _commit_full_blocks(self, request: Request, now: float) -> None:
        size = self.config.block_size
        while (request.committed + 1) * size <= request.cached:
            i = request.committed
            request.chain = block_hash(request.chain, request.tokens(i * size, (i + 1) * size))
            parent = request.blocks[i - 1] if i else None
            if parent is not None and self.blocks.hash_of[parent] is None:
                parent = None
            self.blocks.commit(request.blocks[i], request.chain, request.adapter, parent, now)
            request.committed += 1

    def _append(self, request: Request, row, now: float) -> None:
        """Draw the next token and decide whether the request is done."""
        token = self.backend.sample(row, request)
        if request.first_token_s is None:
            request.first_token_s = now
        params = request.params
        if token == self.tokenizer.eos_id and not params.ignore_eos:
            self._finish(request, "stop")
            return
        request.output.append(token)
        text = self.tokenizer.decode(request.output)
        cut = -1
        if params.stop:
            cut = min((i for s in params.stop if (i := text.find(s)) >= 0), default=-1)
        request.text = text if cut < 0 else text[:cut]
        if cut >= 0:
            self._finish(request, "stop")
        elif len(request.output) >= params.max_tokens:
            self._finish(request, "length")

    def _finish(self, request: Request, reason: str) -> None:
        self.log.note("finished", request.seq)
        if request in self.running:
            self.running.remove(request)
            self.memory.unpin(request.adapter)
        elif request.kv_load is not None:  # aborted while its blocks came back
            self.memory.wait(request.kv_load)  # the copy must not land in a reused block
            self._land_kv(request, self.clock.now())  # and what came is cached, not lost
            self.memory.unpin(request.adapter)
        self.blocks.release(request.blocks)
        request.blocks = []
        request.state, request.finish_reason = FINISHED, reason
        if self.request_log is not None:
            self.request_log.finished(request)
        if reason == "abort" and request.on_update is not None:
            request.on_update(request)

    # ------------------------------------------------------------------ convenience

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        adapters: Sequence[str | None],
    ) -> list[Request]:
        """Run ``prompts`` (each with its adapter) to completion; the finished requests."""
        requests = [self.add(p, params, a) for p, a in zip(prompts, adapters, strict=True)]
        while self.has_work:
            self.step()
        return requests


def _sized(config: EngineConfig, model: Transformer) -> EngineConfig:
    """``config`` with ``num_blocks`` from ``device_memory`` (whole blocks of this model's
    keys and values; adapters are cut into blocks of the same bytes), when that is given."""
    if config.device_memory <= 0:
        return config
    per_block = PagedKVCache.block_bytes(model, config.block_size)
    blocks = config.device_memory // per_block
    if blocks < 2:
        raise ConfigError(
            f"--device-memory: {config.device_memory} bytes hold {blocks} block(s) of "
            f"{per_block} bytes (--block-size {config.block_size}); at least 2 are needed"
        )
    return replace(config, num_blocks=int(blocks))
