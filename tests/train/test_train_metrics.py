"""Metrics file, summary, progress lines and the measured CPU peak."""

from __future__ import annotations

import io
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from legato.calibrate.device_peak import peak_flops
from legato.train.metrics import (
    MetricsLog,
    StepMetrics,
    format_bytes,
    mfu,
    plot_loss_curve,
    read_metrics,
    summarize,
)
from legato.train.progress import Progress


def _step(step: int, loss: float, rate: float = 1000.0) -> StepMetrics:
    return StepMetrics(step, loss, 1e-3, 0.5, 512, 512 / rate, rate, 0.25, 1 << 20)


def test_metrics_log_keeps_history_up_to_the_resumed_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for s in range(1, 6):
        log.write(_step(s, 5.0 - s))
    log.close()
    resumed = MetricsLog(path, resume_step=3)  # steps 4 and 5 will be run again
    resumed.write(_step(4, 0.5))
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [
        (1, 4),
        (2, 3),
        (3, 2),
        (4, 0.5),
    ]
    assert read_metrics(path)[0] == asdict(_step(1, 4.0))
    fresh = MetricsLog(path)  # a new run in the same directory starts over
    fresh.close()
    assert read_metrics(path) == []


def test_summary_uses_medians_and_the_final_loss(tmp_path: Path) -> None:
    records = [asdict(_step(s, 10.0 / s, rate=r)) for s, r in [(1, 10.0), (2, 1000.0), (3, 1200.0)]]
    summary = summarize(records)
    assert summary["final_loss"] == pytest.approx(10 / 3) and summary["first_loss"] == 10.0
    assert summary["tokens_per_s_median"] == 1000.0 and summary["steps"] == 3
    assert summary["mfu_median"] == 0.25 and summary["peak_memory_bytes"] == 1 << 20
    png = plot_loss_curve(records, tmp_path / "loss.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_mfu_and_bytes() -> None:
    assert mfu(6e6, 1000.0, 1e10, 2) == pytest.approx(0.3)
    assert format_bytes(512) == "512 B" and format_bytes(3 << 20) == "3.0 MiB"
    assert format_bytes(5 << 30) == "5.0 GiB"


def test_plain_progress_prints_every_n_steps_and_the_last() -> None:
    out = io.StringIO()
    progress = Progress(total_steps=7, start_step=0, log_every=3, stream=out)
    for s in range(1, 8):
        progress.update(_step(s, 1.0))
    progress.close()
    steps = [line.split()[1] for line in out.getvalue().splitlines()]
    assert steps == ["1/7", "3/7", "6/7", "7/7"]
    assert "loss 1.0000" in out.getvalue() and "mfu 25.0%" in out.getvalue()
    quiet = io.StringIO()
    Progress(7, 0, 1, enabled=False, stream=quiet).update(_step(1, 1.0))
    assert quiet.getvalue() == ""


def test_cpu_peak_is_measured_once() -> None:
    peak, source = peak_flops(torch.device("cpu"), "fp32")
    assert source == "measured" and 1e9 < peak < 1e14
    began = time.perf_counter()
    assert peak_flops(torch.device("cpu"), "fp32")[0] == peak
    assert time.perf_counter() - began < 0.05


def test_profiled_steps_are_left_out_of_the_timings_when_others_ran():
    from legato.train.metrics import summarize

    def record(step: int, seconds: float, profiled: bool) -> dict:
        return {"step": step, "loss": 1.0, "lr": 0.1, "grad_norm": 1.0, "tokens": 100,
                "step_time_s": seconds, "tokens_per_s": 100 / seconds, "mfu": None,
                "peak_memory_bytes": 1, "profiled": profiled}  # fmt: skip

    timed = summarize([record(1, 9.0, True), record(2, 9.0, True), record(3, 1.0, False)])
    assert timed["step_time_s_median"] == 1.0
    only = summarize([record(1, 9.0, True), record(2, 7.0, True)])
    assert only["step_time_s_median"] == 8.0  # nothing else ran: the profiled ones
