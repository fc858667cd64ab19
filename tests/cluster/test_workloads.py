"""The measured inputs: Gavel's table and Pollux's profiles read in their published shapes,
the trace reader, and the jobs file — with one clear line for bad input."""

from __future__ import annotations

import json

import pytest
from cluster_cases import A3C, R18, R50

from legato.cluster.jobs import ClusterShape, read_jobs_file
from legato.cluster.policies import make_policy
from legato.cluster.simulator import simulate
from legato.cluster.trace import default_trace, read_trace, trace_jobs
from legato.cluster.workloads import load_workloads
from legato.errors import DataError


def test_solo_step_at_the_reference_batch_is_gavels_rate(workloads):
    for job_type in (A3C, R18, R50):
        batch = workloads.reference_batch(job_type)
        assert workloads.worker_time(job_type, batch) == pytest.approx(
            1 / workloads.solo[(job_type, 1)], rel=1e-12
        )
    fixed, per_sample = workloads.worker_line(R50)
    assert fixed > 0 and per_sample > 0  # a larger local batch costs more, not proportionally


def test_pair_speeds_read_either_way_and_sync_grows_from_zero(workloads):
    a, b = workloads.pair_speeds(A3C, R50)
    assert workloads.pair_speeds(R50, A3C) == (b, a)
    assert 0 < a < 1 and 0 < b < 1
    assert workloads.sync_time(R50, 1) == 0.0
    assert workloads.sync_time(R50, 8) >= workloads.sync_time(R50, 2) > 0


def test_bad_tables_are_named(tmp_path):
    bad = tmp_path / "table.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="--colocation"):
        load_workloads(colocation=bad)
    bad.write_text(json.dumps({"k80": {}}))
    with pytest.raises(DataError, match=r"--gpu: .* has no table for 'v100'; it has: k80"):
        load_workloads(colocation=bad)
    with pytest.raises(DataError, match="--profiles"):
        load_workloads(profiles=tmp_path)


def test_trace_jobs_take_their_duration_alone(workloads):
    jobs = trace_jobs(default_trace(), workloads, 5, seed=3)
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    assert jobs[0].arrival_s == 0.0
    for j in jobs:  # alone on a big cluster, each takes exactly its trace duration
        result = simulate([j], ClusterShape(2, 8), workloads, make_policy("fifo"))
        (state,) = result.jobs
        assert state.finished_s - j.arrival_s == pytest.approx(j.duration_s, rel=1e-9)
    faster = trace_jobs(default_trace(), workloads, 5, seed=3, load=2.0)
    assert [f.arrival_s for f in faster] == pytest.approx([j.arrival_s / 2 for j in jobs])


def test_bad_trace_rows_are_named_by_line(tmp_path, workloads):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "timestamp,duration,num_gpus\n2017-10-01 00:00:00,60,1\n2017-10-01 00:01:00,abc,1\n"
    )
    with pytest.raises(DataError, match="line 3"):
        read_trace(trace)
    trace.write_text("timestamp,num_gpus\n0,1\n")
    with pytest.raises(DataError, match=r"lacks column\(s\) \['duration'\]"):
        read_trace(trace)
    trace.write_text("timestamp,duration,num_gpus\n0,60,1\n5,60,16\n")
    with pytest.raises(DataError, match="line 3: a job of 16 GPUs cannot fit the 8-device"):
        trace_jobs(trace, workloads, 2, max_gpus=8)


def test_jobs_file(tmp_path, workloads):
    path = tmp_path / "jobs.toml"
    path.write_text(
        "[cluster]\nnodes = 1\ndevices_per_node = 4\n"
        f'[[job]]\nname = "a"\ntype = "{R18}"\nworkers = 2\nsteps = 100\n'
        f'[[job]]\nname = "b"\ntype = "{A3C}"\nworkers = 1\nsteps = 50\narrival_s = 10\n'
    )
    shape, jobs = read_jobs_file(path, workloads)
    assert shape.devices == 4 and [j.name for j in jobs] == ["a", "b"]
    assert jobs[1].arrival_s == 10.0
    path.write_text(f'[[job]]\nname = "a"\ntype = "{R18}"\nworkers = 3\nsteps = 1\n')
    with pytest.raises(DataError, match="job 'a': needs 3 devices, the cluster has 1"):
        read_jobs_file(path, workloads)
    path.write_text('[[job]]\nname = "a"\ntype = "GPT-5"\nworkers = 1\nsteps = 1\n')
    with pytest.raises(DataError, match="unknown job type 'GPT-5'; known: A3C"):
        read_jobs_file(path, workloads)
    path.write_text(f'[[job]]\nname = "a"\ntype = "{R18}"\nworkers = 1\nsteps = 1\ngpus = 2\n')
    with pytest.raises(DataError, match=r"unknown key\(s\) \['gpus'\]"):
        read_jobs_file(path, workloads)
