"""What a simulation (or a real run) measured: the metrics of the field, and their pictures.

Metrics as packing papers report them: mean and p99 job completion time (finish - arrival),
mean queueing delay (first start - arrival), makespan (the last finish), utilisation (the
share of device-seconds in which a device held at least one worker, up to the makespan) and
the share of jobs with a deadline that met it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from legato.atomic import write_atomic
from legato.cluster.simulator import SimulationResult

_UNITS = (("hours", 3600.0, 7200.0), ("minutes", 60.0, 600.0), ("seconds", 1.0, 0.0))


def metrics(result: SimulationResult) -> dict[str, Any]:
    """One flat dict: ``mean_jct_s``, ``p99_jct_s``, ``mean_queueing_s``, ``makespan_s``,
    ``utilization``, ``deadlines_met``, ``jobs``, ``restarts``, ``packed_device_s``."""
    done = [s for s in result.jobs if s.finished_s is not None]
    if not done:
        raise ValueError("no job finished")
    jct = np.array([s.finished_s - s.job.arrival_s for s in done])
    queued = np.array([s.started_s - s.job.arrival_s for s in done])
    makespan = max(s.finished_s for s in done)
    held = sum(end - start for start, end, _, _ in result.timeline)
    packed = sum(end - start for start, end, _, names in result.timeline if len(names) > 1)
    due = [s for s in done if s.job.deadline_s is not None]
    met = sum(s.finished_s <= s.job.deadline_s for s in due)
    return {
        "policy": result.policy,
        "jobs": len(done),
        "devices": result.shape.devices,
        "mean_jct_s": float(jct.mean()),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "mean_queueing_s": float(queued.mean()),
        "makespan_s": float(makespan),
        "utilization": held / (result.shape.devices * makespan) if makespan > 0 else 0.0,
        "packed_device_s": packed,
        "deadlines_met": met / len(due) if due else None,
        "restarts": sum(s.restarts for s in done),
        "decisions": result.decisions,
    }


def run_report(ran: Any, predicted: SimulationResult) -> dict[str, Any]:
    """A real run (``executor.RunResult``) beside the simulator's prediction of the same jobs:
    both metrics, the ratio of mean JCTs (measured / simulated), and each job's two JCTs."""
    measured = metrics(ran.result) if any(s.finished_s for s in ran.result.jobs) else None
    simulated = metrics(predicted)
    sim_jct = {s.name: s.finished_s - s.job.arrival_s for s in predicted.jobs}
    jobs = [
        {
            "name": s.name,
            "arrival_s": s.job.arrival_s,
            "jct_s": None if s.finished_s is None else s.finished_s - s.job.arrival_s,
            "simulated_jct_s": sim_jct[s.name],
            "restarts": s.restarts,
            "startup_s": ran.startup_s.get(s.name, []),
            "failed": ran.failures.get(s.name),
        }
        for s in ran.result.jobs
    ]
    ratio = (
        measured["mean_jct_s"] / simulated["mean_jct_s"] if measured and not ran.failures else None
    )
    return {
        "policy": ran.result.policy,
        "share_mode": ran.share_mode,
        "measured": measured,
        "predicted": simulated,
        "mean_jct_ratio": ratio,
        "jobs": jobs,
        "failures": ran.failures,
        "events": ran.events,
    }


def render(
    results: list[SimulationResult], path: str | Path, labels: list[str] | None = None
) -> Path:
    """A PNG: the JCT CDF of every result (labelled by policy, or ``labels``), and each
    one's device occupancy over time (idle, one worker, two packed), in hours, minutes or
    seconds as the span asks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    labels = labels or [r.policy for r in results]
    end = max(e for r in results for _, e, _, _ in r.timeline)
    unit, scale = next((u, k) for u, k, least in _UNITS if end >= least)
    fig, axes = plt.subplots(
        1 + len(results), 1, figsize=(10, 3 + 1.6 * len(results)), squeeze=False
    )
    cdf = axes[0][0]
    for result, label in zip(results, labels, strict=True):
        jct = np.sort([s.finished_s - s.job.arrival_s for s in result.jobs if s.finished_s])
        cdf.plot(jct / scale, np.arange(1, len(jct) + 1) / len(jct), label=label)
    cdf.set_xscale("log")
    cdf.set_xlabel(f"job completion time ({unit})")
    cdf.set_ylabel("share of jobs")
    cdf.legend(loc="lower right")
    cdf.set_title("JCT CDF")
    colours = ListedColormap(["#f0f0f0", "#4c72b0", "#dd8452"])
    for ax, result, label in zip((row[0] for row in axes[1:]), results, labels, strict=True):
        bins = np.linspace(0, end, 400)
        grid = np.zeros((result.shape.devices, len(bins) - 1))
        for start, stop, device, names in result.timeline:
            lo, hi = np.searchsorted(bins, [start, stop])
            grid[device, max(lo - 1, 0) : max(hi - 1, lo)] = len(names)
        ax.imshow(grid, aspect="auto", cmap=colours, vmin=0, vmax=2, interpolation="nearest",
                  extent=(0, end / scale, result.shape.devices, 0))  # fmt: skip
        ax.set_ylabel(f"{label}\ndevice")
    axes[-1][0].set_xlabel(f"time ({unit}); grey idle, blue one worker, orange two packed")
    fig.tight_layout()
    written = write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return written
