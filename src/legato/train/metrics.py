"""Per-step training metrics: ``metrics.jsonl``, the loss curve and the end-of-run summary.

MFU is model FLOPs per token (``cost.flops.training_flops_per_token``, the same count the
planner uses) times tokens/s, over the peak of all devices of the job; recomputation or
padding would not count as useful work.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class StepMetrics:
    """One optimizer step, as logged (loss is the mean over every token of the global batch)."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None  # None: an fp16 step skipped for overflowed gradients
    tokens: int
    step_time_s: float
    tokens_per_s: float
    mfu: float | None
    peak_memory_bytes: int
    predicted_step_time_s: float | None = None  # the cost model's, for this job
    batch_split: list[int] | None = None  # each data-parallel rank's rows this step
    loss_scale: float | None = None  # fp16: the dynamic loss scale after this step
    profiled: bool = False  # ran under torch.profiler (train.profile_steps): slower


@dataclass
class EvalMetrics:
    """A validation pass after ``step`` (its own ``metrics.jsonl`` record: no ``loss`` key)."""

    step: int
    val_loss: float
    val_perplexity: float
    val_tokens: int


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "loss" in r]


def eval_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "val_loss" in r]


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated bytes on a GPU; on the CPU, this process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float, world_size: int) -> float:
    return flops_per_token * tokens_per_s / (peak_flops * world_size)


class MetricsLog:
    """Appends one JSON line per step (and per validation pass); on resume drops lines past
    the checkpoint's step."""

    def __init__(self, path: Path, resume_step: int = 0) -> None:
        self.path = path
        kept = [r for r in read_metrics(path) if r["step"] <= resume_step] if resume_step else []
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in kept)
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held for the run

    def write(self, metrics: StepMetrics | EvalMetrics) -> None:
        self._handle.write(json.dumps(asdict(metrics)) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (an absent file has none)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Final loss, median throughput and MFU, peak memory of the given step records.

    Medians rather than means: the first step pays for warm-up and checkpoint steps for
    writing, and neither is the steady state the numbers are meant to describe. Steps
    that ran under the profiler are left out of the timings when others ran.
    """
    evals = eval_records(records)
    records = step_records(records)
    if not records:
        return {}
    timed = [r for r in records if not r.get("profiled")] or records
    mfus = [r["mfu"] for r in timed if r["mfu"] is not None]
    return {
        "steps": records[-1]["step"],
        "first_loss": records[0]["loss"],
        "final_loss": records[-1]["loss"],
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in timed),
        "step_time_s_median": statistics.median(r["step_time_s"] for r in timed),
        "mfu_median": statistics.median(mfus) if mfus else None,
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in records),
        **({"final_val_loss": evals[-1]["val_loss"]} if evals else {}),
    }


def plot_loss_curve(records: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Training (and validation) loss against step as a PNG (matplotlib's Agg backend: no
    display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps, evals = step_records(records), eval_records(records)
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], linewidth=1.2, label="train")
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["val_loss"] for r in evals],
            marker="o",
            markersize=3,
            linewidth=1.2,
            label="validation",
        )
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"
