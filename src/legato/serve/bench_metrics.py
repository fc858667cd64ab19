"""What ``legato bench serve`` reports, defined as vLLM's ``benchmark_serving`` defines it so
that the numbers compare with vLLM's, S-LoRA's and their successors' tables.

Per successful request (times on the client, from sending the request):

- TTFT, time to first token: the first chunk that carries text.
- TPOT, time per output token after the first: ``(end - first) / (output_tokens - 1)``,
  where ``end`` is the last chunk with text; only requests of two or more tokens count.
- ITL, inter-token latency: every gap between consecutive text chunks, all requests pooled
  (a request whose chunks carry several tokens has fewer, longer gaps).
- E2EL, end-to-end latency: ``end - start``.

Throughputs divide the completed requests and their tokens by the benchmark's wall time.
Goodput is the completed requests per second that meet every SLO given (a bound is met when
the value is at most the bound; a one-token request's TPOT counts as 0, as in vLLM); it is
None when no SLO is given. Statistics of an empty list are 0, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass
class RequestTiming:
    """One request as the client saw it; times are seconds after the benchmark started."""

    index: int
    adapter: str | None
    start_s: float
    first_token_s: float | None
    token_times: list[float]  # when each chunk with text arrived
    end_s: float
    prompt_tokens: int
    output_tokens: int
    ok: bool
    error: str | None


def summarize(
    timings: Sequence[RequestTiming],
    duration_s: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    percentiles: Sequence[float] = (50, 90, 99),
) -> dict:
    """vLLM's result keys: counts, throughputs, and mean/median/std/pNN of ttft_ms, tpot_ms,
    itl_ms and e2el_ms (see the module docstring)."""
    done = [t for t in timings if t.ok]
    ttfts = [t.first_token_s - t.start_s for t in done]
    tpots = [_tpot(t) for t in done if t.output_tokens > 1]
    itls = [later - earlier for t in done for earlier, later in pairwise(t.token_times)]
    e2els = [t.end_s - t.start_s for t in done]
    total_input = sum(t.prompt_tokens for t in done)
    total_output = sum(t.output_tokens for t in done)
    result = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(timings) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "request_goodput": _goodput(done, duration_s, slo_ttft_s, slo_tpot_s),
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
    }
    for name, seconds in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result.update(_stats(name, seconds, percentiles))
    return result


def _tpot(timing: RequestTiming) -> float:
    return (timing.end_s - timing.first_token_s) / (timing.output_tokens - 1)


def _goodput(
    done: list[RequestTiming], duration_s: float, slo_ttft_s: float | None, slo_tpot_s: float | None
) -> float | None:
    if slo_ttft_s is None and slo_tpot_s is None:
        return None
    good = 0
    for t in done:
        ttft_ok = slo_ttft_s is None or t.first_token_s - t.start_s <= slo_ttft_s
        tpot = _tpot(t) if t.output_tokens > 1 else 0.0
        if ttft_ok and (slo_tpot_s is None or tpot <= slo_tpot_s):
            good += 1
    return good / duration_s


def _stats(name: str, seconds: list[float], percentiles: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds or [0.0]) * 1000.0
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(ms, p))
    return out
