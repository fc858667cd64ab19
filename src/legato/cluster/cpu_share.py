"""A worker's device and its share of it, on a CPU host: a CPU set and a CPU quota.

On CPUs a cluster "device" is a set of cores (``cores_of``). A worker process is pinned to
its device's cores with ``sched_setaffinity`` (every thread it has, and so every thread it
starts), and its share of the device — Gimbal's resource restriction, an MPS active-thread
percentage on a GPU — is a CFS bandwidth quota of its own cgroup: ``share x cores`` CPU
periods per period, rewritten at run time when the policy changes the share. cgroup v2
(``cpu.max``) and v1 (``cpu.cfs_quota_us``) are both written; where neither can be (no
permission, no cpu controller), the share falls back to a core cap: the worker is pinned
to ``ceil(share x cores)`` of its device's cores (so torch starts that many threads), which
cannot go below one core. ``CpuShare.mode`` says which one ran.

A run's cgroups live under one parent of its own, ``legato/<kind>-<pid>-<id>``
(``run_cgroups``), removed when the run ends; the owner's pid in the name lets the next
run remove the parent of one that crashed (``remove_stale_cgroups``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
BASE = "legato"  # every legato cgroup sits below this one, in each hierarchy
PERIOD_US = 100_000  # the kernel's default CFS period
CGROUP = "cgroup"
CORE_CAP = "core cap"


def cores_of(device: int, cores_per_device: int, host_cores: int) -> tuple[int, ...]:
    """The cores of local device ``device`` (devices are consecutive, disjoint core ranges)."""
    first = device * cores_per_device
    if first + cores_per_device > host_cores:
        raise ValueError(
            f"device {device} needs cores {first}..{first + cores_per_device - 1}; this host "
            f"has {host_cores}"
        )
    return tuple(range(first, first + cores_per_device))


def pin_process(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to ``cores`` (``sched_setaffinity`` is per thread;
    threads started later inherit their creator's set)."""
    tasks = Path("/proc/self/task")
    for tid in os.listdir(tasks) if tasks.is_dir() else [0]:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cores)
    os.sched_setaffinity(0, cores)


@dataclass
class CpuShare:
    """This process's device (its cores) and share of it: its own cgroup, or the core cap.
    ``slot`` (0 or 1, its place among the device's tenants) picks which cores a core cap
    keeps, so two capped tenants take opposite ends of the device."""

    cores: tuple[int, ...]
    mode: str
    slot: int = 0
    cgroup: Path | None = None

    @classmethod
    def create(cls, name: str, cores: tuple[int, ...], slot: int = 0) -> CpuShare:
        """Pin this process to ``cores`` and put it in a cgroup of its own, ``legato/<name>``
        (the core cap where no cgroup with a CPU quota can be made)."""
        pin_process(cores)
        for group in _cgroup_dirs(name):
            try:
                _enable_cpu_controller(group)
                group.mkdir(parents=True, exist_ok=True)
                if not any((group / f).exists() for f in ("cpu.max", "cpu.cfs_quota_us")):
                    raise OSError("no cpu controller")  # checked before the process moves in
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                with contextlib.suppress(OSError):
                    group.rmdir()
                continue
            return cls(cores, CGROUP, slot, group)
        return cls(cores, CORE_CAP, slot)

    def apply(self, share: float | None) -> None:
        """Set the share (None = the whole device), effective at once."""
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        if self.mode == CORE_CAP:
            keep = max(1, math.ceil((share or 1.0) * len(self.cores) - 1e-9))
            pin_process(self.cores[:keep] if self.slot == 0 else self.cores[-keep:])
            return
        assert self.cgroup is not None
        quota = -1 if share is None else max(1000, round(share * len(self.cores) * PERIOD_US))
        if (self.cgroup / "cpu.max").exists():
            limit = "max" if quota < 0 else str(quota)
            (self.cgroup / "cpu.max").write_text(f"{limit} {PERIOD_US}")
        else:
            (self.cgroup / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.cgroup / "cpu.cfs_quota_us").write_text(str(quota))

    def describe(self, share: float | None) -> str:
        """What enforces the share, for the run log."""
        cores = f"{len(self.cores)} core(s)"
        if share is None:
            return f"all of {cores}"
        if self.mode == CGROUP:
            return f"{share:.0%} of {cores} by cgroup CPU quota"
        return f"{share:.0%} of {cores} as a core cap (no writable cgroup; >= 1 core)"

    def remove(self) -> None:
        """Delete the cgroup once its process has gone (a no-op under the core cap)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


def _bases() -> list[Path]:
    """Where legato's cgroups may go: under v2's unified tree (needs the cpu controller)
    or v1's cpu hierarchy."""
    places = []
    unified = CGROUP_ROOT / "cgroup.controllers"
    if unified.is_file() and "cpu" in unified.read_text().split():
        places.append(CGROUP_ROOT / BASE)
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        places.append(CGROUP_ROOT / "cpu" / BASE)
    return places


def _cgroup_dirs(name: str) -> list[Path]:
    return [base / name for base in _bases()]


@contextlib.contextmanager
def run_cgroups(kind: str) -> Iterator[str]:
    """The name of a fresh per-run parent (``<kind>-<pid>-<id>``) for the block's
    ``CpuShare`` cgroups (``f"{name}/<worker>"``); it and everything below it is removed
    when the block ends. Stale parents of dead runs are removed first."""
    remove_stale_cgroups()
    name = f"{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        for place in _cgroup_dirs(name):
            remove_cgroup_tree(place)


def cgroups_owned_by(pid: int) -> list[Path]:
    """The per-run parents that process ``pid`` made and still exist."""
    return [p for base in _bases() if base.is_dir() for p in base.iterdir() if _owner(p) == pid]


def remove_stale_cgroups() -> None:
    """Remove the per-run parents whose owner process is gone (a crashed run), and empty
    ones of no known owner; a cgroup that still holds a live process stays."""
    for base in _bases():
        for parent in base.iterdir() if base.is_dir() else ():
            owner = _owner(parent)
            if parent.is_dir() and (owner is None or not _alive(owner)):
                remove_cgroup_tree(parent, timeout_s=0.0)


def remove_cgroup_tree(top: Path, timeout_s: float = 5.0) -> bool:
    """rmdir ``top`` and every cgroup below it, deepest first, retrying for ``timeout_s``
    while killed processes leave them; whether it is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        for here, _, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            with contextlib.suppress(OSError):
                os.rmdir(here)
        if not top.exists() or time.monotonic() >= deadline:
            return not top.exists()
        time.sleep(0.05)


def _owner(parent: Path) -> int | None:
    parts = parent.name.split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _enable_cpu_controller(group: Path) -> None:
    """cgroup v2 gives a child ``cpu.max`` only where every parent delegates the controller
    (``+cpu`` in its ``cgroup.subtree_control``); v1 needs nothing."""
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():
        return
    parent = CGROUP_ROOT
    for part in group.relative_to(CGROUP_ROOT).parts[:-1]:
        control = parent / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")
        parent = parent / part
        parent.mkdir(exist_ok=True)
