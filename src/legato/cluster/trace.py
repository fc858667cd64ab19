"""Jobs from a cluster trace in the Philly CSV format (``timestamp, duration, num_gpus, ...``).

Each row becomes one job: its arrival (seconds after the window's first submission, divided
by ``load`` so that ``load = 2`` submits the same jobs twice as fast), its GPU count as data-
parallel workers, and its steps: the row's duration times the exclusive speed of a job type
drawn at random from the workloads (the trace has no model names; the practice of Gavel,
Lucid and Gimbal). Philly has no deadlines either: a job is due ``slack`` x its duration
after it arrives, slack uniform in [1.5, 3] (the synthetic deadlines of deadline-aware
schedulers' evaluations).
"""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

from legato.cluster.jobs import ClusterJob
from legato.cluster.workloads import Workloads, bundled
from legato.csv_rows import read_rows
from legato.errors import DataError

REQUIRED = ("timestamp", "duration", "num_gpus")
SLACK = (1.5, 3.0)


def default_trace() -> Path:
    """The bundled 2,000-job window of the Philly trace (see cluster/data/README.md)."""
    return bundled("philly_sample.csv")


def read_trace(path: str | Path) -> list[tuple[int, float, float, int]]:
    """(line, submission seconds, duration s, gpus) of every row, in submission order; a
    malformed row is refused naming its line."""
    rows = read_rows(
        path,
        flag="--trace",
        columns=REQUIRED,
        format_name="the Philly format",
        row_kind="job",
        parse=_parse_row,
    )
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


def _parse_row(path: Path, line: int, row: dict) -> tuple[int, float, float, int]:
    where = f"--trace: {path} line {line}"
    try:
        stamp = row["timestamp"]
        numeric = stamp.replace(".", "", 1).isdigit()
        submitted = float(stamp) if numeric else datetime.fromisoformat(stamp).timestamp()
        duration = float(row["duration"])
        gpus = int(float(row["num_gpus"]))
    except (TypeError, ValueError, AttributeError):
        raise DataError(
            f"{where}: expected a timestamp (seconds or YYYY-MM-DD HH:MM:SS), a duration in "
            f"seconds and an integer num_gpus, got {dict(row)}"
        ) from None
    if duration <= 0 or gpus < 1:
        raise DataError(f"{where}: duration must be > 0 and num_gpus >= 1, got {duration}, {gpus}")
    return line, submitted, duration, gpus


def trace_jobs(
    path: str | Path,
    workloads: Workloads,
    jobs: int,
    seed: int = 0,
    load: float = 1.0,
    max_gpus: int | None = None,
) -> list[ClusterJob]:
    """``jobs`` consecutive rows from a random start (seeded), as ClusterJobs (see above).

    A row needing more than ``max_gpus`` devices is refused naming its line: the cluster
    could never run it.
    """
    if jobs < 1:
        raise DataError(f"--jobs: must be >= 1, got {jobs}")
    if load <= 0:
        raise DataError(f"--load: must be > 0, got {load}")
    rows = read_trace(path)
    rng = random.Random(seed)
    start = rng.randrange(max(1, len(rows) - jobs + 1))
    window = rows[start : start + jobs]
    first = window[0][1]
    types = workloads.types
    out = []
    for i, (line, submitted, duration, gpus) in enumerate(window):
        if max_gpus is not None and gpus > max_gpus:
            raise DataError(
                f"--trace: {path} line {line}: a job of {gpus} GPUs cannot fit the "
                f"{max_gpus}-device cluster (raise --gpus, or pick another --seed window)"
            )
        job_type = rng.choice(types)
        speed = 1.0 / (
            workloads.worker_time(job_type, workloads.reference_batch(job_type))
            + workloads.sync_time(job_type, gpus)
        )
        arrival = (submitted - first) / load
        out.append(
            ClusterJob(
                name=f"j{i:05d}",
                job_type=job_type,
                workers=gpus,
                steps=duration * speed,
                arrival_s=arrival,
                deadline_s=arrival + duration * rng.uniform(*SLACK),
                duration_s=duration,
            )
        )
    return out
