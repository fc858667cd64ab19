"""A cluster run's cgroups live under one parent of its own, removed when the run ends; a
parent whose owner died (a crashed run) is removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys

from legato.cluster import cpu_share
from legato.cluster.cpu_share import cgroups_owned_by, remove_stale_cgroups, run_cgroups


def _fake_v1_tree(root, monkeypatch):
    """A directory laid out as cgroup v1's cpu hierarchy (rmdir of an empty one works)."""
    (root / "cpu").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    monkeypatch.setattr(cpu_share, "CGROUP_ROOT", root)
    return root / "cpu" / cpu_share.BASE


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return int(proc.stdout)


def test_a_run_removes_its_parent_and_every_worker_cgroup(tmp_path, monkeypatch):
    base = _fake_v1_tree(tmp_path, monkeypatch)
    with run_cgroups("run") as name:
        assert name.startswith(f"run-{os.getpid()}-")
        (base / name / "job-w0").mkdir(parents=True)  # what a worker's CpuShare makes
        (base / name / "3" / "probe0-w0").mkdir(parents=True)
        assert cgroups_owned_by(os.getpid()) == [base / name]
    assert not (base / name).exists()
    assert cgroups_owned_by(os.getpid()) == []


def test_the_next_run_removes_what_a_dead_run_left(tmp_path, monkeypatch):
    base = _fake_v1_tree(tmp_path, monkeypatch)
    dead = base / f"run-{_dead_pid()}-0badc0de"
    (dead / "job-w0").mkdir(parents=True)
    legacy = base / "profile-3"  # the layout before per-run parents: no owner in the name
    legacy.mkdir()
    alive = base / f"run-{os.getppid()}-1234abcd"  # another run, still running
    (alive / "job-w0").mkdir(parents=True)
    remove_stale_cgroups()
    assert not dead.exists() and not legacy.exists()
    assert (alive / "job-w0").is_dir()
