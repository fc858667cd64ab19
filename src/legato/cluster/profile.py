"""``legato cluster profile``: the co-location table of legato's own jobs, measured here.

For each job type of a jobs file it measures, on the devices ``cluster run`` uses and with
the same Ray workers: steps/s alone at its batch and at half and twice that (the
local-batch curve sample stealing moves along), with two data-parallel workers on two
devices (the gradient synchronisation), and packed in pairs with every type (itself
included) on one device (the packing slowdowns). Each is a rate over a common window after
a warm-up, with every job of the measurement running throughout. The files come out in
the shapes the simulator reads for Gavel and Pollux (``workloads.py``): ``colocation.json``
under device ``cpu``, ``profiles/<type>.csv``, and ``profile.json`` with how it was taken and
the measured start-up time of a job (launch to its first step), which the simulator
charges at each start.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from legato.atomic import write_atomic, write_text_atomic
from legato.cluster.cpu_share import run_cgroups
from legato.cluster.job_types import JobType, train_config
from legato.cluster.ray_jobs import START_TIMEOUT_S, launch
from legato.errors import DataError

DEVICE = "cpu"  # the table's device key (Gavel's are v100, p100, k80)
PROFILE_STEPS = 100_000  # a measurement's trainer never reaches its end
WARM_STEPS = 3


@dataclass(frozen=True)
class Probe:
    """One job of a measurement: ``kind`` at ``batch`` per worker on ``devices``."""

    kind: JobType
    batch: int
    devices: tuple[int, ...]


def measure(
    probes: list[Probe], window_s: float, work_dir: Path, cores_per_device: int, run_id: str
) -> tuple[list[float], list[float]]:
    """Run ``probes`` together; (steps/s of each over one common window, start-up seconds
    of each: launch to first step)."""
    tenants: dict[int, int] = {}
    running = []
    launched = time.monotonic()
    try:
        for i, probe in enumerate(probes):
            slots = []
            for device in probe.devices:
                slots.append(tenants.get(device, 0))
                tenants[device] = slots[-1] + 1
            workers = len(probe.devices)
            config = train_config(
                probe.kind, PROFILE_STEPS, workers, probe.batch * workers, work_dir / f"probe{i}"
            )
            where = (probe.devices, None, tuple(slots), cores_per_device, run_id, 0.0)
            running.append(launch(f"probe{i}", config, *where))
        startup: list[float | None] = [None] * len(probes)
        while True:
            steps = [_step(r) for r in running]
            for i, step in enumerate(steps):
                if step >= 1 and startup[i] is None:
                    startup[i] = time.monotonic() - launched
            if min(steps) >= WARM_STEPS:
                break
            if time.monotonic() - launched > START_TIMEOUT_S:
                raise RuntimeError(f"profiling: no {WARM_STEPS} steps in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        first, began = [_step(r) for r in running], time.monotonic()
        time.sleep(window_s)
        last, ended = [_step(r) for r in running], time.monotonic()
    finally:
        for incarnation in running:
            incarnation.release()
    rates = [(b - a) / (ended - began) for a, b in zip(first, last, strict=True)]
    return rates, [s or 0.0 for s in startup]


def _step(incarnation: Any) -> int:
    states = incarnation.poll()
    error = next((s["error"] for s in states if s["error"]), None)
    if error:
        raise RuntimeError(f"profiling job {incarnation.job} failed: {error}")
    return min(s["step"] for s in states)


def profile(
    types: dict[str, JobType],
    devices: int,
    out_dir: str | Path,
    window_s: float = 6.0,
    cores_per_device: int = 1,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every type (see the module docstring) and write the three files to
    ``out_dir``; the ``profile.json`` contents."""
    out = Path(out_dir)
    work = out / ".probes"
    kinds = list(types.values())
    plan: list[tuple[str, list[Probe]]] = []
    for kind in kinds:
        for batch in sorted({max(1, kind.batch // 2), kind.batch, 2 * kind.batch}):
            plan.append((f"{kind.name} alone, batch {batch}", [Probe(kind, batch, (0,))]))
        if devices >= 2:
            plan.append((f"{kind.name} on 2 devices", [Probe(kind, kind.batch, (0, 1))]))
    for i, a in enumerate(kinds):
        for b in kinds[i:]:
            pair = [Probe(a, a.batch, (0,)), Probe(b, b.batch, (0,))]
            plan.append((f"{a.name} + {b.name} on one device", pair))
    results, startups = [], []
    with run_cgroups("profile") as run_id:
        for n, (what, probes) in enumerate(plan, 1):
            # each round trains in a folder of its own: a killed probe leaves no checkpoint
            rates, startup = measure(
                probes, window_s, work / str(n), cores_per_device, f"{run_id}/{n}"
            )
            say(f"[{n}/{len(plan)}] {what}: " + ", ".join(f"{r:.2f} steps/s" for r in rates))
            results.append(rates)
            startups.extend(startup)
    shutil.rmtree(work, ignore_errors=True)
    table: dict[str, Any] = {}
    curves: dict[str, list[tuple[int, float]]] = {k.name: [] for k in kinds}
    for (_, probes), rates in zip(plan, results, strict=True):
        first = probes[0]
        key = _key(first.kind.key, len(first.devices))
        if len(probes) == 2:
            other = _key(probes[1].kind.key, 1)
            table.setdefault(key, {})[other] = [rates[0], rates[1]]
        elif len(first.devices) == 2:
            table.setdefault(key, {})["null"] = 2 * rates[0]  # Gavel counts every worker's steps
        else:
            curves[first.kind.name].append((first.batch, 1.0 / rates[0]))
            if first.batch == first.kind.batch:
                table.setdefault(key, {})["null"] = rates[0]
    meta = {
        "device": DEVICE,
        "cores_per_device": cores_per_device,
        "window_s": window_s,
        "startup_s": statistics.median(startups),
        "types": {k.key: {"name": k.name, "batch": k.batch} for k in kinds},
    }
    write_text_atomic(out / "colocation.json", json.dumps({DEVICE: table}, indent=1))
    for name, points in curves.items():
        write_atomic(out / "profiles" / f"{name}.csv", lambda tmp, p=points: _write_curve(tmp, p))
    write_text_atomic(out / "profile.json", json.dumps(meta, indent=1))
    return meta


def _key(job_type: str, workers: int) -> str:
    return repr((job_type, workers))


def _write_curve(path: Path, points: list[tuple[int, float]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["placement", "local_bsz", "step_time", "sync_time"])
        for batch, seconds in points:
            writer.writerow([1, batch, f"{seconds:.6f}", 0])


def read_profile(path: str | Path) -> dict[str, Any]:
    """A profile folder's ``profile.json`` plus the paths the simulator reads."""
    folder = Path(path)
    try:
        meta = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"--profile: {folder} is not a `legato cluster profile` folder ({exc})"
        ) from None
    meta["colocation"] = str(folder / "colocation.json")
    meta["profiles"] = str(folder / "profiles")
    return meta
