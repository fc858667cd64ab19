"""The request stream of ``legato bench serve``: when each request arrives, which adapter
it asks for, and how long its prompt and its answer are.

Two sources, both seeded so that a run can be repeated exactly:

- ``synthetic``: vLLM's ``benchmark_serving`` arrivals (Gamma inter-arrival times of mean
  ``1/request_rate`` and shape ``burstiness``, so burstiness 1 is a Poisson process and the
  coefficient of variation is ``1/sqrt(burstiness)``; the first request at t = 0) with
  S-LoRA's adapter popularity and uniform lengths.
- ``azure_trace``: the arrivals and lengths of the Azure LLM inference trace 2023
  (``TIMESTAMP,ContextTokens,GeneratedTokens``), compressed in time and scaled in length to
  fit the machine; the trace names no adapters, so they are drawn by the same popularity law.

Adapter popularity is S-LoRA's (``benchmarks/trace.py``: ``np.random.power(alpha)`` scaled
by the number of adapters and floored): adapter ``i`` of ``n`` has probability
``((i+1)/n)**alpha - (i/n)**alpha``. ``alpha = 1`` is uniform, ``alpha < 1`` concentrates
the requests on the first adapters (S-LoRA's runs use 1, 0.6, 0.3, 0.1) and ``alpha > 1``
on the last ones. This form rather than Zipf's ``(i+1)**-alpha`` so that S-LoRA's settings
mean here what they mean in its paper.

No torch here: the stream is plain data, built before the clock starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from legato.csv_rows import read_rows
from legato.errors import ConfigError, DataError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_WORD_END = 0.2  # the chance that a prompt character is a space: words of ~5 letters


@dataclass(frozen=True)
class BenchRequest:
    """One request of the stream; ``arrival_s`` is seconds after the benchmark starts."""

    index: int
    arrival_s: float
    adapter: str | None  # None: the base model
    prompt_tokens: int
    output_tokens: int


def adapter_popularity(num_adapters: int, alpha: float) -> np.ndarray:
    """S-LoRA's probability of each adapter (see the module docstring); sums to 1."""
    if alpha <= 0 or not math.isfinite(alpha):
        raise ConfigError(f"--alpha: must be a finite number > 0 (1 is uniform), got {alpha}")
    edges = (np.arange(num_adapters + 1) / num_adapters) ** alpha
    return np.diff(edges)


def synthetic(
    num_requests: int,
    request_rate: float,
    burstiness: float,
    adapters: list[str],
    alpha: float,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int = 0,
) -> list[BenchRequest]:
    """``num_requests`` requests (see the module docstring); ``request_rate = inf`` sends all
    at t = 0. Lengths are uniform in ``[lo, hi)``, or exactly ``lo`` when ``lo == hi``.

    Arrivals, adapters and each length come from their own seeded streams, so the same seed
    gives the same arrivals and lengths whatever the adapters and alpha: runs that compare
    popularity laws see the same traffic."""
    if num_requests < 1:
        raise ConfigError(f"--num-prompts: must be >= 1, got {num_requests}")
    if not request_rate > 0:
        raise ConfigError(f"--request-rate: must be > 0 (inf: all at once), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ConfigError(
            f"--burstiness: must be a finite number > 0 (1 is Poisson), got {burstiness}"
        )
    arrival_rng, adapter_rng, input_rng, output_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    if math.isinf(request_rate):
        arrivals = np.zeros(num_requests)
    else:
        gaps = arrival_rng.gamma(burstiness, 1.0 / (request_rate * burstiness), num_requests - 1)
        arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    names = _assign_adapters(adapters, alpha, num_requests, adapter_rng)
    prompts = _uniform_lengths("--input-len", input_len, num_requests, input_rng)
    outputs = _uniform_lengths("--output-len", output_len, num_requests, output_rng)
    return [
        BenchRequest(i, float(arrivals[i]), names[i], int(prompts[i]), int(outputs[i]))
        for i in range(num_requests)
    ]


def azure_trace(
    path: str | Path,
    num_requests: int | None,
    adapters: list[str],
    alpha: float,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_prompt: int = 4096,
    max_output: int = 1024,
    seed: int = 0,
) -> list[BenchRequest]:
    """The first ``num_requests`` rows of an Azure LLM trace CSV (all when None), in arrival
    order: arrivals are seconds after the first row divided by ``time_scale`` (2 replays the
    trace twice as fast), lengths are multiplied by ``length_scale``, rounded and clipped to
    ``[1, max_prompt]`` and ``[1, max_output]``. A malformed row is refused naming its line."""
    if num_requests is not None and num_requests < 1:
        raise ConfigError(f"--num-prompts: must be >= 1, got {num_requests}")
    for flag, value in (("--time-scale", time_scale), ("--length-scale", length_scale)):
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag}: must be a finite number > 0, got {value}")
    for flag, value in (("--max-prompt-len", max_prompt), ("--max-output-len", max_output)):
        if value < 1:
            raise ConfigError(f"{flag}: must be >= 1, got {value}")
    rows = read_azure(path)
    if num_requests is not None:
        if num_requests > len(rows):
            raise ConfigError(
                f"--num-prompts: {path} has {len(rows)} requests, fewer than {num_requests}"
            )
        rows = rows[:num_requests]
    names = _assign_adapters(adapters, alpha, len(rows), np.random.default_rng(seed))
    first = rows[0][0]
    return [
        BenchRequest(
            index=i,
            arrival_s=(stamp - first) / time_scale,
            adapter=names[i],
            prompt_tokens=min(max_prompt, max(1, round(context * length_scale))),
            output_tokens=min(max_output, max(1, round(generated * length_scale))),
        )
        for i, (stamp, context, generated) in enumerate(rows)
    ]


def read_azure(path: str | Path) -> list[tuple[float, int, int]]:
    """(arrival in epoch seconds, prompt tokens, output tokens) of every row, in arrival order."""
    rows = read_rows(
        path,
        flag="--trace",
        columns=AZURE_COLUMNS,
        format_name="the Azure LLM trace",
        row_kind="request",
        parse=_parse_azure_row,
    )
    rows.sort(key=lambda r: r[0])  # stable: rows of one timestamp keep the file's order
    return rows


def prompt_text(tokens: int, seed: int) -> str:
    """``tokens`` printable ASCII characters of lowercase words, the same for the same seed:
    exactly ``tokens`` tokens under legato's byte tokenizer (one per byte), fewer under BPE."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(ord("a"), ord("z") + 1, size=tokens, dtype=np.uint8)
    codes[rng.random(tokens) < _WORD_END] = ord(" ")
    return codes.tobytes().decode("ascii")


def _assign_adapters(
    adapters: list[str], alpha: float, n: int, rng: np.random.Generator
) -> list[str | None]:
    if not adapters:
        return [None] * n
    picks = rng.choice(len(adapters), size=n, p=adapter_popularity(len(adapters), alpha))
    return [adapters[i] for i in picks]


def _uniform_lengths(
    flag: str, bounds: tuple[int, int], n: int, rng: np.random.Generator
) -> np.ndarray:
    lo, hi = bounds
    if lo < 1 or hi < lo:
        raise ConfigError(f"{flag}: must be LO,HI with 1 <= LO <= HI, got {lo},{hi}")
    return np.full(n, lo) if lo == hi else rng.integers(lo, hi, size=n)


def _parse_azure_row(path: Path, line: int, row: dict) -> tuple[float, int, int]:
    try:
        stamp = _epoch_seconds(row["TIMESTAMP"])
        context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
    except (AttributeError, TypeError, ValueError):  # a short row has None fields
        raise DataError(
            f"--trace: {path} line {line}: expected YYYY-MM-DD HH:MM:SS[.fraction] and two "
            f"integer token counts, got {','.join(str(v) for v in row.values())}"
        ) from None
    if context < 0 or generated < 0:
        raise DataError(f"--trace: {path} line {line}: token counts must be >= 0")
    return stamp, context, generated


def _epoch_seconds(stamp: str) -> float:
    """Azure's ``2023-11-16 18:15:46.6805900`` (seven fraction digits, more than
    ``datetime`` takes before Python 3.11) as seconds; the zone is irrelevant to gaps."""
    whole, _, fraction = stamp.strip().partition(".")
    if fraction and not fraction.isdigit():
        raise ValueError(stamp)
    moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    return moment.timestamp() + (float("0." + fraction) if fraction else 0.0)
