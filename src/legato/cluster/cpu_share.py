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
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
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


def _cgroup_dirs(name: str) -> list[Path]:
    """Where a cgroup may go: under v2's unified tree (needs the cpu controller) or v1's
    cpu hierarchy."""
    places = []
    unified = CGROUP_ROOT / "cgroup.controllers"
    if unified.is_file() and "cpu" in unified.read_text().split():
        places.append(CGROUP_ROOT / "legato" / name)
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        places.append(CGROUP_ROOT / "cpu" / "legato" / name)
    return places


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
