"""`legato cluster profile` and `cluster run` for real: legato trainers as Ray actors on this
host's cores. One local Ray instance (loopback) serves the module and is shut down after."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.distributed

from legato.cluster.executor import Executor  # noqa: E402
from legato.cluster.job_types import JobType  # noqa: E402
from legato.cluster.jobs import ClusterJob, ClusterShape  # noqa: E402
from legato.cluster.placement import Placement  # noqa: E402
from legato.cluster.policies.fifo import Fifo  # noqa: E402
from legato.cluster.profile import profile, read_profile  # noqa: E402
from legato.cluster.ray_jobs import ray_session  # noqa: E402
from legato.cluster.workloads import load_workloads  # noqa: E402

TINY = JobType("tiny2l", 2, {"model": {"preset": "tiny", "overrides": {"num_layers": 1}},
                             "data": {"seq_len": 32}})  # fmt: skip


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(devices=2, cores_per_device=1):
        yield


@pytest.fixture(scope="module")
def measured(local_ray, tmp_path_factory):
    """A profile of the one tiny type on one device, short windows."""
    out = tmp_path_factory.mktemp("profile")
    profile({TINY.name: TINY}, devices=1, out_dir=out, window_s=1.0, say=lambda _: None)
    return out


def test_profile_writes_the_tables_the_simulator_reads(measured):
    meta = read_profile(measured)
    workloads = load_workloads(meta["colocation"], meta["profiles"], meta["device"])
    key = TINY.key
    solo = workloads.solo[(key, 1)]
    assert solo > 1.0  # steps/s of a one-layer model on a core
    assert 0 < meta["startup_s"] < 60
    # two CPU-bound workers time-slicing one core: each is slower than alone
    speed_a, speed_b = workloads.pair_speeds(key, key)
    assert speed_a < 0.9 and speed_b < 0.9
    # a step at twice the batch takes longer than at half of it
    assert workloads.worker_time(key, 4) > workloads.worker_time(key, 1)
    assert json.loads((Path(measured) / "colocation.json").read_text())["cpu"]


class Script:
    """A test policy: the decisions of ``plan`` in turn, one per round (then the last)."""

    name = "script"

    def __init__(self, plan, round_s=1.5):
        self.plan, self.round_s, self.calls = plan, round_s, 0

    def assign(self, view):
        step = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        active = {p.name for p in view.active}
        return {name: placement for name, placement in step.items() if name in active}


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "loss" in r and "grad_norm" in r]


def _workloads(measured):
    meta = read_profile(measured)
    return load_workloads(meta["colocation"], meta["profiles"], meta["device"])


def test_a_moved_and_resplit_job_runs_every_step_once(measured, tmp_path):
    """Moved to the other device mid-run, the job resumes from its checkpoint: every step
    from 1 to its end is trained exactly once; a new split reaches the running trainer."""
    job = ClusterJob("mover", TINY.key, workers=1, steps=120)
    pair = ClusterJob("pair", TINY.key, workers=2, steps=200, global_batch=8)
    plan = [
        {"mover": Placement((0,))},
        {"mover": Placement((1,)), "pair": Placement((0, 1))},
        {"mover": Placement((1,)), "pair": Placement((0, 1), split=(5, 3))},
    ]
    executor = Executor(ClusterShape(1, 2), [job, pair], {TINY.name: TINY}, _workloads(measured),
                        Script(plan), tmp_path, say=lambda _: None)  # fmt: skip
    ran = executor.run()
    assert not ran.failures
    states = {s.name: s for s in ran.result.jobs}
    assert states["mover"].restarts == 1 and states["mover"].finished_s is not None
    assert _steps(tmp_path / "jobs" / "mover") == list(range(1, 121))
    assert _steps(tmp_path / "jobs" / "pair") == list(range(1, 201))
    rows = (tmp_path / "jobs" / "pair" / "metrics.jsonl").read_text().splitlines()
    splits = {tuple(json.loads(r).get("batch_split") or ()) for r in rows}
    assert (5, 3) in splits and (4, 4) in splits
    assert any("moved after step" in e for e in ran.events)


@pytest.mark.slow  # 30 s on 2 cores; make test keeps the launch that fails below
def test_a_failed_job_frees_its_device_for_the_others(measured, tmp_path):
    """A worker that dies takes only its own job down: it is reported, its device goes to
    the job that waited for it, and that job finishes."""
    jobs = [
        ClusterJob("victim", TINY.key, workers=1, steps=5_000),  # ends even if not killed
        ClusterJob("steady", TINY.key, workers=1, steps=1200),
        ClusterJob("waiter", TINY.key, workers=1, steps=60, arrival_s=1.0),
    ]
    executor = Executor(ClusterShape(1, 2), jobs, {TINY.name: TINY}, _workloads(measured),
                        Fifo(), tmp_path, say=lambda _: None)  # fmt: skip

    killed = threading.Event()

    def kill_victim():
        for _ in range(600):
            incarnation = executor.running.get("victim")
            if incarnation is not None and incarnation.poll()[0]["step"] >= 5:
                ray.kill(incarnation.actors[0])
                killed.set()
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_victim)
    killer.start()
    ran = executor.run()
    killer.join()
    assert killed.is_set()
    states = {s.name: s for s in ran.result.jobs}
    assert set(ran.failures) == {"victim"}
    assert states["steady"].finished_s is not None
    assert states["waiter"].finished_s is not None
    # the waiter got the victim's device while the steady job still held the other one
    assert states["waiter"].started_s >= states["victim"].last_run_s - 1.0
    assert states["steady"].finished_s > states["waiter"].started_s


def test_a_launch_that_fails_fails_its_job_only(measured, tmp_path):
    """A type whose trainer cannot start (its data path does not exist) fails that job with
    its error; the other job runs to its end and nothing of the failed launch is left."""
    broken = JobType("broken", 2, {"model": {"preset": "tiny", "overrides": {"num_layers": 1}},
                                   "data": {"seq_len": 32, "paths": [str(tmp_path / "none.txt")]}})  # fmt: skip
    jobs = [ClusterJob("bad", TINY.key, workers=1, steps=50),
            ClusterJob("good", TINY.key, workers=1, steps=50)]  # fmt: skip
    executor = Executor(ClusterShape(1, 2), jobs, {TINY.name: TINY}, _workloads(measured),
                        Fifo(), tmp_path, say=lambda _: None)  # fmt: skip
    executor.kind["bad"] = broken  # same speed table, a trainer that cannot start
    ran = executor.run()
    assert set(ran.failures) == {"bad"} and "none.txt" in ran.failures["bad"]
    assert {s.name: s for s in ran.result.jobs}["good"].finished_s is not None
    assert not executor.running
    from ray.util import placement_group_table

    assert all(g["state"] == "REMOVED" for g in placement_group_table().values())
