"""The benchmark's numbers on hand-made timings, against values worked out by hand."""

from __future__ import annotations

import pytest

from legato.serve.bench_metrics import RequestTiming, summarize


def _timing(index, start, tokens, output_tokens, prompt_tokens, ok=True) -> RequestTiming:
    return RequestTiming(
        index=index,
        adapter=None,
        start_s=start,
        first_token_s=tokens[0] if tokens else None,
        token_times=tokens,
        end_s=tokens[-1] if tokens else start + 0.1,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ok=ok,
        error=None if ok else "HTTP 500: boom",
    )


TIMINGS = [
    # TTFT 0.5, TPOT (1.1 - 0.5) / 3 = 0.2, ITL 0.1 0.2 0.3, E2EL 1.1
    _timing(0, 0.0, [0.5, 0.6, 0.8, 1.1], output_tokens=4, prompt_tokens=10),
    # two chunks carrying 3 tokens: TTFT 0.2, TPOT 0.1 / 2 = 0.05, ITL 0.1, E2EL 0.3
    _timing(1, 1.0, [1.2, 1.3], output_tokens=3, prompt_tokens=20),
    # one token: TTFT 0.4, no TPOT (0 for goodput), no ITL, E2EL 0.4
    _timing(2, 2.0, [2.4], output_tokens=1, prompt_tokens=5),
    _timing(3, 3.0, [], output_tokens=0, prompt_tokens=7, ok=False),
]


def test_counts_and_throughputs() -> None:
    result = summarize(TIMINGS, duration_s=4.0)
    assert result["completed"] == 3 and result["failed"] == 1
    assert result["total_input_tokens"] == 35  # failed requests count no tokens
    assert result["total_output_tokens"] == 8
    assert result["request_throughput"] == pytest.approx(0.75)
    assert result["output_throughput"] == pytest.approx(2.0)
    assert result["total_token_throughput"] == pytest.approx(43 / 4)
    assert result["request_goodput"] is None  # no SLO given


def test_latency_statistics() -> None:
    result = summarize(TIMINGS, duration_s=4.0, percentiles=(50, 90, 99.9))
    expected = {
        "mean_ttft_ms": 1100 / 3,
        "median_ttft_ms": 400,
        "p50_ttft_ms": 400,
        "p90_ttft_ms": 480,  # linear between the sorted 400 and 500
        "p99.9_ttft_ms": 499.8,
        "mean_tpot_ms": 125,
        "median_tpot_ms": 125,
        "std_tpot_ms": 75,
        "mean_itl_ms": 175,  # 100, 200, 300 and 100, pooled
        "median_itl_ms": 150,
        "mean_e2el_ms": 600,
        "median_e2el_ms": 400,
    }
    assert {k: result[k] for k in expected} == pytest.approx(expected)


@pytest.mark.parametrize(
    ("slo_ttft_s", "slo_tpot_s", "good"),
    [
        (0.3, None, 1),  # only request 1 answers within 0.3 s
        (0.5, None, 3),  # a bound is met at equality
        (None, 0.1, 2),  # request 2's single token has TPOT 0
        (0.3, 0.1, 1),
        (0.1, 0.01, 0),
    ],
)
def test_goodput_counts_requests_meeting_every_slo(slo_ttft_s, slo_tpot_s, good) -> None:
    result = summarize(TIMINGS, duration_s=4.0, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    assert result["request_goodput"] == pytest.approx(good / 4.0)


def test_all_failed_gives_zero_statistics() -> None:
    result = summarize(TIMINGS[3:], duration_s=1.0, slo_ttft_s=1.0)
    assert result["completed"] == 0 and result["failed"] == 1
    assert result["mean_ttft_ms"] == result["p99_itl_ms"] == 0.0
    assert result["request_goodput"] == 0.0
