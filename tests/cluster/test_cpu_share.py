"""A worker's device is a CPU set and its share a CPU quota (or, without cgroups, a core cap)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from legato.cluster import cpu_share
from legato.cluster.cpu_share import CGROUP, CORE_CAP, CpuShare, cores_of, run_cgroups

BUSY = """
import sys, time
from legato.cluster.cpu_share import CpuShare
share = CpuShare.create(sys.argv[1], (0,))
share.apply(float(sys.argv[2]))
wall, cpu = time.monotonic(), time.process_time()
while time.monotonic() - wall < 1.5:
    pass
print(share.mode, (time.process_time() - cpu) / (time.monotonic() - wall))
"""


def test_cores_of_devices_are_disjoint_ranges():
    assert cores_of(0, 2, 4) == (0, 1)
    assert cores_of(1, 2, 4) == (2, 3)
    with pytest.raises(ValueError, match="this host has 4"):
        cores_of(2, 2, 4)


def test_quota_limits_a_busy_process_to_its_share():
    """A process that spins for 1.5 s gets about its share of the core, not all of it."""
    with run_cgroups("test") as parent:
        out = subprocess.run(
            [sys.executable, "-c", BUSY, f"{parent}/busy", "0.3"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
    mode, fraction = out.stdout.split()[0], float(out.stdout.split()[-1])
    if mode != CGROUP:
        pytest.skip("no writable cgroup with a CPU quota here (the core cap ran)")
    assert 0.15 < fraction < 0.45


def test_core_cap_without_cgroups_pins_to_part_of_the_device(tmp_path, monkeypatch):
    """Where no cgroup can be made the share becomes a number of the device's cores; the
    two tenants of a device take opposite ends."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    monkeypatch.setattr(cpu_share, "CGROUP_ROOT", tmp_path)  # an empty tree: no controllers
    before = os.sched_getaffinity(0)
    try:
        first = CpuShare.create("a", (0, 1), slot=0)
        assert first.mode == CORE_CAP and first.cgroup is None
        first.apply(0.5)
        assert os.sched_getaffinity(0) == {0}
        CpuShare((0, 1), CORE_CAP, slot=1).apply(0.5)
        assert os.sched_getaffinity(0) == {1}
        first.apply(None)
        assert os.sched_getaffinity(0) == {0, 1}
        assert "core cap" in first.describe(0.5)
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            first.apply(1.5)
    finally:
        cpu_share.pin_process(tuple(before))
