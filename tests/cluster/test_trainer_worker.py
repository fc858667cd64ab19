"""A cluster worker (the class Ray makes an actor of), in this process: once ``start``
returns, its trainer takes a new batch split, however loaded the host is (the executor
may re-split a job in the same round it launched it)."""

from __future__ import annotations

import os
import time

from legato.cluster import cpu_share
from legato.cluster.job_types import JobType, train_config
from legato.cluster.ray_jobs import TrainerWorker
from legato.train.trainer import Trainer

TINY = JobType("tiny1l", 2, {"model": {"preset": "tiny", "overrides": {"num_layers": 1}},
                             "data": {"seq_len": 32}})  # fmt: skip


def test_a_split_sent_right_after_start_reaches_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_share, "CGROUP_ROOT", tmp_path / "no-cgroups")  # the core cap
    predict = Trainer._predict

    def slow_predict(self, *args):  # a loaded host: set-up takes a while
        time.sleep(1.0)
        return predict(self, *args)

    monkeypatch.setattr(Trainer, "_predict", slow_predict)
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.setenv(name, "")  # start() sets them in this process: restored after
    affinity = os.sched_getaffinity(0)
    worker = TrainerWorker("test/w0", device=0, cores_per_device=1, slot=0)
    try:
        config = train_config(TINY, 400, 1, 8, tmp_path / "run")
        worker.start(config, 0, 1, ("127.0.0.1", 0), None)
        worker.set_split([8])  # before the fix: "set_batch_split needs the layout" here
        assert worker.trainer.batch_split == [8]
    finally:
        worker.stop()
        deadline = time.monotonic() + 120
        while not worker.finished and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_share.pin_process(tuple(affinity))
    assert worker.finished and worker.error is None, worker.error
