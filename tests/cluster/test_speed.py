"""The one speed model: pair speeds, resource restriction, and sample stealing."""

from __future__ import annotations

import pytest
from cluster_cases import A3C, R50, job

from legato.cluster.placement import AssignmentError, Placement, even_split
from legato.cluster.speed import job_rates, restricted, stealing_split, step_time, worker_speeds


def test_restriction_moves_the_pairs_throughput_and_never_beats_solo():
    natural = (0.6, 0.8)
    assert restricted(natural, None, None) == natural
    a, b = restricted(natural, 0.6 / 1.4, None)  # the natural shares give the natural speeds
    assert (a, b) == pytest.approx(natural)
    a, b = restricted(natural, 0.3, None)
    assert a + b == pytest.approx(1.4) and a == pytest.approx(0.42)
    assert restricted(natural, 0.9, None)[0] == 1.0  # capped at its solo speed
    with pytest.raises(AssignmentError, match="exceed 1"):
        restricted(natural, 0.7, 0.5)


def test_packed_workers_slow_and_unpackable_pairs_refused(workloads):
    host = job(workloads, "host", R50, 100, workers=2)
    guest = job(workloads, "guest", A3C, 100)
    jobs = {"host": host, "guest": guest}
    packed = {"host": Placement((0, 1)), "guest": Placement((1,))}
    speeds = worker_speeds(packed, jobs, workloads)
    fa, fb = workloads.pair_speeds(R50, A3C)
    assert speeds == {"host": [1.0, fa], "guest": [fb]}
    rates = job_rates(packed, jobs, workloads)
    alone = job_rates({"host": Placement((0, 1))}, jobs, workloads)
    assert rates["host"] < alone["host"]  # a data-parallel step waits for its slowest worker


def test_stealing_equalises_worker_times_within_the_batch(workloads):
    host = job(workloads, "host", R50, 100, workers=4)
    batch = host.local_batches(workloads)
    speeds = [1.0, 1.0, 0.5, 1.0]
    split = stealing_split(host, speeds, workloads)
    assert sum(split) == batch and min(split) >= 1
    assert split[2] < split[0]  # the packed (slow) worker gets fewer samples
    times = [workloads.worker_time(R50, b) / s for b, s in zip(split, speeds, strict=True)]
    one_more = max(workloads.worker_line(R50)[1] / s for s in speeds)
    assert max(times) - min(times) <= one_more + 1e-12  # equal up to one sample's time
    assert step_time(host, split, speeds, workloads) < step_time(host, None, speeds, workloads)
    assert stealing_split(host, [1.0] * 4, workloads) == even_split(batch, 4)
