"""A training job as the cluster level sees it, the cluster it runs on, and the jobs file.

A job is what a trace row or a ``[[job]]`` table gives: a type whose speed the workloads
know, data-parallel workers (one per device), the optimizer steps it must run at its fixed
global batch, when it arrives and, optionally, when it is due. Work is counted in steps, so
re-splitting the global batch between workers never changes how much work is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from legato.cluster.job_types import JobType, read_job_types
from legato.cluster.workloads import Workloads
from legato.errors import DataError
from legato.specs.typed import read_table_file


@dataclass(frozen=True)
class ClusterShape:
    """``nodes`` x ``devices_per_node`` accelerators; device ``d`` is on node ``d // per_node``."""

    nodes: int
    devices_per_node: int

    def __post_init__(self) -> None:
        for name in ("nodes", "devices_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise DataError(f"cluster.{name}: must be an integer >= 1, got {value!r}")

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    @classmethod
    def of_gpus(cls, gpus: int, per_node: int = 8) -> ClusterShape:
        """``gpus`` devices in nodes of ``per_node`` (one smaller node when it does not divide)."""
        if not isinstance(gpus, int) or gpus < 1:
            raise DataError(f"--gpus: must be an integer >= 1, got {gpus!r}")
        if not isinstance(per_node, int) or per_node < 1:
            raise DataError(f"--per-node: must be an integer >= 1, got {per_node!r}")
        per_node = min(per_node, gpus)
        if gpus % per_node:
            raise DataError(f"--gpus: {gpus} is not a multiple of {per_node} devices per node")
        return cls(nodes=gpus // per_node, devices_per_node=per_node)


@dataclass(frozen=True)
class ClusterJob:
    """One job: ``steps`` optimizer steps of ``job_type`` on ``workers`` devices."""

    name: str
    job_type: str
    workers: int
    steps: float
    arrival_s: float = 0.0
    global_batch: int = 0  # 0 = workers x the type's reference batch
    deadline_s: float | None = None  # absolute time it should have finished by
    duration_s: float | None = None  # its exclusive run time, where a trace gives it

    def local_batches(self, workloads: Workloads) -> int:
        """The global batch (its reference when the job left it at 0)."""
        return self.global_batch or self.workers * workloads.reference_batch(self.job_type)


def check_jobs(jobs: list[ClusterJob], shape: ClusterShape, workloads: Workloads) -> None:
    """Refuse, before anything runs, a job the cluster can never hold or whose type is unknown."""
    names = set()
    for job in jobs:
        where = f"job {job.name!r}"
        if job.name in names:
            raise DataError(f"{where}: the name is used twice; every job needs its own")
        names.add(job.name)
        workloads.check_type(job.job_type, f"{where}: type")
        if job.workers > shape.devices:
            raise DataError(
                f"{where}: needs {job.workers} devices, the cluster has {shape.devices} "
                f"({shape.nodes} x {shape.devices_per_node})"
            )
        if job.global_batch and job.global_batch < job.workers:
            raise DataError(
                f"{where}: global_batch {job.global_batch} is smaller than its "
                f"{job.workers} workers (each needs a sample)"
            )


_JOB_KEYS = {"name", "type", "workers", "steps", "arrival_s", "global_batch", "deadline_s"}


def read_jobs_file(path: str | Path, workloads: Workloads) -> tuple[ClusterShape, list[ClusterJob]]:
    """A jobs TOML: ``[cluster] nodes, devices_per_node`` and one ``[[job]]`` table per job
    (``name``, ``type``, ``workers``, ``steps``, optional ``arrival_s``, ``global_batch``,
    ``deadline_s``); a ``type`` may name one of the file's ``[type.NAME]`` tables
    (``cluster/job_types.py``)."""
    shape, jobs, _ = read_jobs_and_types(path, workloads)
    return shape, jobs


def read_jobs_and_types(
    path: str | Path, workloads: Workloads | None
) -> tuple[ClusterShape, list[ClusterJob], dict[str, JobType]]:
    """``read_jobs_file`` and the file's legato job types; ``workloads`` None skips the
    check of types against a speed table (``cluster profile`` is about to measure them)."""
    data = read_table_file(path, DataError)
    types = read_job_types(data, path)
    cluster = data.get("cluster", {})
    shape = ClusterShape(
        nodes=cluster.get("nodes", 1), devices_per_node=cluster.get("devices_per_node", 1)
    )
    tables = data.get("job", [])
    if not tables:
        raise DataError(f"{path}: no [[job]] tables; each job needs name, type, workers, steps")
    jobs = [_job_from_table(i, table, path, types) for i, table in enumerate(tables)]
    if workloads is not None:
        check_jobs(jobs, shape, workloads)
    return shape, jobs, types


def _job_from_table(
    index: int, table: dict, path: str | Path, types: dict[str, JobType]
) -> ClusterJob:
    where = f"{path}: job {index + 1}"
    unknown = set(table) - _JOB_KEYS
    if unknown:
        raise DataError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_JOB_KEYS)}")
    missing = {"name", "type", "workers", "steps"} - set(table)
    if missing:
        raise DataError(f"{where}: missing {sorted(missing)}")
    workers, steps = table["workers"], table["steps"]
    if not isinstance(workers, int) or workers < 1:
        raise DataError(f"{where}: workers must be an integer >= 1, got {workers!r}")
    if not isinstance(steps, int | float) or not math.isfinite(steps) or steps <= 0:
        raise DataError(f"{where}: steps must be a positive number, got {steps!r}")
    arrival = table.get("arrival_s", 0.0)
    if not isinstance(arrival, int | float) or arrival < 0:
        raise DataError(f"{where}: arrival_s must be >= 0, got {arrival!r}")
    deadline = table.get("deadline_s")
    if deadline is not None and (not isinstance(deadline, int | float) or deadline <= arrival):
        raise DataError(
            f"{where}: deadline_s must be after arrival_s ({arrival}), got {deadline!r}"
        )
    batch = table.get("global_batch", 0)
    if not isinstance(batch, int) or batch < 0:
        raise DataError(f"{where}: global_batch must be an integer >= 1, got {batch!r}")
    return ClusterJob(
        name=str(table["name"]),
        job_type=types[name].key if (name := str(table["type"])) in types else name,
        workers=workers,
        steps=float(steps),
        arrival_s=float(arrival),
        global_batch=batch,
        deadline_s=None if deadline is None else float(deadline),
    )
