"""``legato serve simulate``: the engine's own scheduler, block manager and pool policy run
in simulated time on a modelled device — no second implementation of any of them.

What changes against a real run is only what the engine is given (``Engine``'s
``model``, ``clock`` and adapters): a ``SimClock`` that moves when a step's duration or an
idle wait says so; a ``SimulatedBackend`` whose pool is block counts and bytes
(``memory.py``'s accounting without tensors, so a 7B model with 2,000 adapters costs no
memory) and whose step takes the time a step-time source gives for its batch:

- ``PredictedSteps``: the modelled GPU (``step_time.StepTimeModel``, from the device
  profile) or any function of the batch;
- ``MeasuredSteps``: the start and end of every step of a real run's decision log — the
  self-consistency check: given a run's arrivals, its step times and its link bandwidth,
  the simulation makes the same decisions (``tests/serve/test_simulate.py``).

Every generated token is token 0 (requests run to their length, as S-LoRA's benchmark
runs them); a prompt's first token is its request's index, so no two requests share a
cached prefix by accident — unless the workload gives each adapter a task instruction
(``arrivals_of``'s ``instruction_len``): then every prompt of an adapter begins with the
same instruction, the prefix its cached KV blocks can serve again (block hashes are
rooted in the adapter, so two adapters' instructions never share blocks). ``run`` drives
the engine with an arrival list — the same driver the real engine runs under in the
self-consistency test — and ``report`` gives ``legato bench serve``'s figures plus the
pool's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from legato.lora.adapter import AdapterShape
from legato.serve import workload
from legato.serve.bench_metrics import RequestTiming, summarize
from legato.serve.engine import Engine, Request
from legato.serve.sampling import SamplingParams
from legato.serve.step_time import BatchRow

SIM_VOCAB = 2**31 - 1
INSTRUCTION_TOKEN = SIM_VOCAB - 1  # a task instruction's tokens; request indices stay below
ORPHAN_EVERY = 64


@dataclass(frozen=True)
class AdapterSize:
    """An adapter as the accounting sees it: its shape and its elements (no factors)."""

    shape: AdapterShape
    numel: int


@dataclass(frozen=True)
class Arrival:
    """A request to replay: when it arrives (seconds on the engine's clock), its adapter,
    its prompt and how many tokens it generates."""

    index: int
    arrival_s: float
    adapter: str | None
    prompt: list[int]
    output_tokens: int


class SimTokenizer:
    """The tokenizer of a simulated model: ids of any size, no end of text, no text."""

    vocab_size = SIM_VOCAB
    eos_id = -1

    def decode(self, _ids) -> str:
        return ""


class PredictedSteps:
    """Step times from a function of the batch (``StepTimeModel.step_time``)."""

    def __init__(self, step_time: Callable[[Sequence[BatchRow]], float]) -> None:
        self.step_time = step_time

    def begin(self, _attempt: int) -> float | None:
        return None  # a step begins when the previous one ends

    def duration(self, rows: Sequence[BatchRow]) -> float:
        return self.step_time(rows)


class MeasuredSteps:
    """The steps of a real run (its decision log's ``t``): step ``k`` of the replay begins
    when step ``k`` of the run began and lasts as long. Past the run's last step (a replay
    that decided otherwise) a step lasts the run's mean."""

    def __init__(self, records: Sequence[dict]) -> None:
        self.times = [tuple(r["t"]) for r in records]
        busy = [end - start for start, end in self.times if end > start]
        self.mean = sum(busy) / len(busy) if busy else 0.0
        self.current = 0

    def begin(self, attempt: int) -> float | None:
        self.current = attempt
        return self.times[attempt][0] if attempt < len(self.times) else None

    def duration(self, _rows: Sequence[BatchRow]) -> float:
        if self.current < len(self.times):
            start, end = self.times[self.current]
            return end - start
        return self.mean


class SimulatedBackend:
    """What a simulated step runs on: no weights, no cache tensor; the step takes the time
    ``steps`` gives for its batch on ``clock``."""

    pool = None

    def __init__(
        self, clock, steps, block_bytes: int, max_model_len: int, rank_elements: int,
        element_size: int = 2,
    ) -> None:  # fmt: skip
        """``rank_elements``: elements of a rank-1 adapter on every linear layer (vLLM's
        ``--max-lora-rank`` slot room per rank); ``element_size``: bytes of one."""
        self.clock, self.steps = clock, steps
        self.block_bytes, self.max_model_len = block_bytes, max_model_len
        self.element_size = element_size
        self._per_rank = rank_elements

    def rank_elements(self, rank: int) -> int:
        return rank * self._per_rank

    def step(self, parts) -> list[None]:
        rows = [
            BatchRow(len(p.tokens), p.start, p.adapter and p.adapter.name,
                     p.adapter.shape.rank if p.adapter else 0)
            for p in parts
        ]  # fmt: skip
        self.clock.sleep_until(self.clock.now() + self.steps.duration(rows))
        return [None] * len(parts)

    def sample(self, _row, _request: Request) -> int:
        return 0


def run(
    engine: Engine,
    arrivals: Sequence[Arrival],
    steps=None,
    stop: Callable[[list[Request], float], bool] | None = None,
) -> tuple[list[Request], dict[int, list[float]], float]:
    """Add each arrival when the engine's clock has passed it and step until all are
    done (a step begins when ``steps`` says, if it says), or until ``stop(requests, now)``
    says the outcome is known (asked every ``ORPHAN_EVERY`` steps); the requests added, in
    arrival order, the times each got its tokens (by engine sequence number) and the mean
    share of cached KV blocks whose adapter was not on the device (sampled every
    ``ORPHAN_EVERY`` steps)."""
    clock, pending = engine.clock, deque(sorted(arrivals, key=lambda a: a.arrival_s))
    requests: list[Request] = []
    times: dict[int, list[float]] = {}
    orphans: list[float] = []
    while pending or engine.has_work:
        if not engine.has_work:
            clock.sleep_until(pending[0].arrival_s)
        start = steps.begin(engine.attempts) if steps is not None else None
        if start is not None:
            clock.sleep_until(start)
        now = clock.now()
        while pending and pending[0].arrival_s <= now:
            a = pending.popleft()
            sampling = SamplingParams(max_tokens=a.output_tokens, temperature=0.0,
                                      ignore_eos=True, seed=a.index)  # fmt: skip
            stamps = times.setdefault(engine.added, [])
            requests.append(engine.add(a.prompt, sampling, a.adapter,
                                       _stamper(stamps, clock), arrival_s=a.arrival_s))  # fmt: skip
        engine.step(now)
        if engine.attempts % ORPHAN_EVERY == 0:
            orphans.append(engine.memory.kv_without_adapter())
            if stop is not None and stop(requests, clock.now()):
                break
    return requests, times, sum(orphans) / len(orphans) if orphans else 0.0


def _stamper(stamps: list[float], clock):
    def on_update(request: Request) -> None:
        if request.output:
            stamps.append(clock.now())

    return on_update


def report(
    engine: Engine,
    requests: Sequence[Request],
    times: dict[int, list[float]],
    orphans: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict:
    """``legato bench serve``'s figures (vLLM's names) of the run, and the pool's."""
    timings = []
    for i, r in enumerate(requests):
        stamps = times.get(r.seq, [])
        ok = r.finish_reason == "length" and bool(stamps)
        timings.append(RequestTiming(
            i, r.adapter, r.arrival_s, r.first_token_s, stamps,
            stamps[-1] if stamps else r.arrival_s, len(r.prompt), len(r.output), ok, r.error,
        ))  # fmt: skip
    start = min((r.arrival_s for r in requests), default=0.0)
    end = max((t.end_s for t in timings), default=start)
    result = summarize(timings, max(end - start, 1e-9), slo_ttft_s, slo_tpot_s)
    result.update(pool_figures(engine, requests, orphans))
    return result


def pool_figures(engine: Engine, requests: Sequence[Request], orphans: float) -> dict:
    """Hit rates and bytes of the pool over the run."""
    memory, blocks = engine.memory, engine.blocks
    with_adapter = sum(1 for r in requests if r.adapter is not None)
    loads = memory.loads
    return {
        # copies per request for an adapter (above 1: adapters evicted and loaded again)
        "adapter_loads_per_request": loads / with_adapter if with_adapter else 0.0,
        "adapter_loads": loads,
        "kv_prefix_hit_blocks": blocks.hits,
        "kv_host_hit_blocks": memory.host_kv.hits,
        # of the blocks looked up (a preempted request looks its blocks up again)
        "kv_hit_rate": (blocks.hits + memory.host_kv.hits) / blocks.asked if blocks.asked else 0.0,
        "bytes_swapped_in": memory.swapped_in_bytes,
        "bytes_swapped_out": memory.host_kv.stored_bytes,
        "kv_without_adapter": orphans,
        "preemptions": sum(r.preemptions for r in requests),
        "steps": engine.steps,
    }


def prompt_of(index: int, length: int, instruction_len: int = 0) -> list[int]:
    """A simulated prompt: its adapter's instruction, the request's index, then zeros (see
    the module docstring)."""
    question = [index % INSTRUCTION_TOKEN] + [0] * (length - instruction_len - 1)
    return [INSTRUCTION_TOKEN] * instruction_len + question


def slora_arrivals(
    names: Sequence[str],
    seq_len: int,
    rate: float,
    duration: float,
    cv: float,
    alpha: float,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    instruction_len: int = 0,
    seed: int = 0,
) -> list[Arrival]:
    """S-LoRA's workload (``workload.synthetic``) at ``rate`` over ``duration`` seconds of
    arrivals: enough requests drawn to outlast it, those arriving in it kept."""
    n = max(1, int(rate * duration * 1.5) + 10)
    stream = workload.synthetic(n, rate, 1.0 / cv**2, list(names), alpha, input_len,
                                output_len, seed)  # fmt: skip
    return arrivals_of([r for r in stream if r.arrival_s < duration], seq_len, instruction_len)


def arrivals_of(stream, seq_len: int, instruction_len: int = 0) -> list[Arrival]:
    """``workload.BenchRequest``s as arrivals, each prompt after ``instruction_len`` tokens
    of its adapter's task instruction, prompt plus output cut to ``seq_len``."""
    out = []
    for r in stream:
        prompt = min(instruction_len + r.prompt_tokens, seq_len - 1)
        output = max(1, min(r.output_tokens, seq_len - prompt))
        tokens = prompt_of(r.index, prompt, min(instruction_len, prompt - 1))
        out.append(Arrival(r.index, r.arrival_s, r.adapter, tokens, output))
    return out
