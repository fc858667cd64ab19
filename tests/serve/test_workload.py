"""The request stream: vLLM's arrival process, S-LoRA's popularity law, the Azure reader."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from legato.errors import ConfigError, DataError
from legato.serve.workload import adapter_popularity, azure_trace, prompt_text, synthetic

ADAPTERS = [f"a{i}" for i in range(10)]
SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "serving"  # ../shared


def _stream(**overrides):
    args = dict(
        num_requests=200,
        request_rate=4.0,
        burstiness=1.0,
        adapters=ADAPTERS,
        alpha=0.5,
        input_len=(8, 64),
        output_len=(4, 32),
        seed=3,
    )
    return synthetic(**{**args, **overrides})


def test_synthetic_is_seeded() -> None:
    assert _stream() == _stream()
    assert _stream() != _stream(seed=4)


def test_traffic_does_not_depend_on_the_adapters() -> None:
    """Runs comparing popularity laws replay the same arrivals and lengths."""
    plain = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in _stream(adapters=[])]
    skewed = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in _stream(alpha=0.1)]
    assert plain == skewed


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_have_the_rate_and_the_cv(burstiness: float) -> None:
    rate = 8.0
    stream = _stream(num_requests=100_000, request_rate=rate, burstiness=burstiness)
    gaps = np.diff([r.arrival_s for r in stream])
    assert stream[0].arrival_s == 0.0
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert {r.arrival_s for r in _stream(request_rate=math.inf)} == {0.0}


def test_lengths_are_uniform_in_the_half_open_range() -> None:
    stream = _stream(num_requests=5000, input_len=(8, 12), output_len=(5, 5))
    assert {r.prompt_tokens for r in stream} == {8, 9, 10, 11}
    assert {r.output_tokens for r in stream} == {5}


def test_no_adapters_means_the_base_model() -> None:
    assert {r.adapter for r in _stream(adapters=[])} == {None}


def test_popularity_is_s_loras_power_law() -> None:
    """alpha = 1 is uniform; a smaller alpha piles the requests onto the first adapters."""
    assert adapter_popularity(10, 1.0) == pytest.approx(np.full(10, 0.1))
    skewed = adapter_popularity(10, 0.1)
    assert skewed.sum() == pytest.approx(1.0)
    assert skewed[0] == pytest.approx(0.1**0.1)  # P(power(0.1) < 1/10)
    assert np.all(np.diff(skewed) < 0)
    assert adapter_popularity(10, 0.3)[0] < skewed[0]


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_drawn_adapters_follow_the_popularity(alpha: float) -> None:
    stream = _stream(num_requests=50_000, alpha=alpha)
    counts = Counter(r.adapter for r in stream)
    share = np.array([counts[name] for name in ADAPTERS]) / len(stream)
    assert share == pytest.approx(adapter_popularity(len(ADAPTERS), alpha), abs=0.01)


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"num_requests": 0}, "--num-prompts"),
        ({"request_rate": 0.0}, "--request-rate"),
        ({"burstiness": -1.0}, "--burstiness"),
        ({"alpha": 0.0}, "--alpha"),
        ({"input_len": (0, 4)}, "--input-len"),
        ({"output_len": (9, 4)}, "--output-len"),
    ],
)
def test_bad_settings_name_their_flag(overrides: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        _stream(**overrides)


def _csv(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_azure_trace_compresses_time_and_clips_lengths(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        "2023-11-16 18:15:46.5000000,374,44",
        "2023-11-16 18:15:48.5000000,100,1",
        "2023-11-16 18:15:51.5,40,300",
    )
    stream = azure_trace(
        path, None, [], 1.0, time_scale=2.0, length_scale=0.5, max_prompt=100, max_output=64
    )
    assert [r.arrival_s for r in stream] == pytest.approx([0.0, 1.0, 2.5])
    assert [r.prompt_tokens for r in stream] == [100, 50, 20]
    assert [r.output_tokens for r in stream] == [22, 1, 64]
    assert [r.index for r in stream] == [0, 1, 2]
    assert {r.adapter for r in stream} == {None}


def test_azure_trace_takes_the_first_rows_with_seeded_adapters(tmp_path: Path) -> None:
    rows = [f"2023-11-16 18:15:{s:02d}.0,10,10" for s in range(20)]
    path = _csv(tmp_path, *rows)
    first = azure_trace(path, 5, ADAPTERS, 0.3, seed=1)
    assert len(first) == 5 and first[-1].arrival_s == pytest.approx(4.0)
    assert first == azure_trace(path, 5, ADAPTERS, 0.3, seed=1)
    with pytest.raises(ConfigError, match="--num-prompts"):
        azure_trace(path, 21, ADAPTERS, 0.3)


@pytest.mark.parametrize(
    "bad", ["2023-11-16 18:15:47.1,abc,3", "16/11/2023 18:15:47,3,3", "2023-11-16 18:15:47,3"]
)
def test_azure_bad_row_is_named_by_line(tmp_path: Path, bad: str) -> None:
    path = _csv(tmp_path, "2023-11-16 18:15:46.0,374,44", bad)
    with pytest.raises(DataError, match=rf"{path.name} line 3"):
        azure_trace(path, None, [], 1.0)


def test_azure_missing_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,374\n")
    with pytest.raises(DataError, match="GeneratedTokens"):
        azure_trace(path, None, [], 1.0)


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shared data sets are not checked out")
def test_azure_sample_reads() -> None:
    stream = azure_trace(SAMPLE / "azure_llm_2023_conv.csv", 1000, ADAPTERS, 1.0, time_scale=5.0)
    arrivals = [r.arrival_s for r in stream]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert stream[1].arrival_s == pytest.approx((50.9951690 - 46.6805900) / 5.0)


def test_prompt_text_is_ascii_of_the_length_and_seeded() -> None:
    text = prompt_text(1000, seed=7)
    assert len(text.encode("utf-8")) == 1000 and text.isascii() and text.isprintable()
    assert " " in text and text == prompt_text(1000, seed=7) != prompt_text(1000, seed=8)
