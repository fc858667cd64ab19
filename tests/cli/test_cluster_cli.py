"""``legato cluster simulate`` end to end: JSON fields, the table, the PNG, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from legato.cli.main import main


def test_simulate_json_and_png(tmp_path, capsys):
    png = tmp_path / "c.png"
    args = ["cluster", "simulate", "--policy", "fifo,gimbal", "--jobs", "30", "--gpus", "8"]
    assert main([*args, "--load", "4", "--json", "--png", str(png)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["fifo", "gimbal"]
    for key in ("mean_jct_s", "p99_jct_s", "mean_queueing_s", "makespan_s", "utilization"):
        assert all(r[key] > 0 for r in rows), key
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["cluster", "simulate", "--policy", "lucid", "--jobs", "10", "--gpus", "8"]) == 0
    assert "mean JCT" in capsys.readouterr().out


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["cluster", "simulate", "--policy", "best"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("legato: error: --policy: unknown policy 'best'") and "\n" not in err
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,duration,num_gpus\n0,10,1\n1,x,1\n")
    assert main(["cluster", "simulate", "--trace", str(trace), "--jobs", "2"]) == 2
    assert "line 3" in capsys.readouterr().err


def test_jobs_file_mix_where_only_unequal_packing_helps(capsys):
    """The example mix: a 4-worker job fills the cluster, smaller ones arrive behind it; only
    Gimbal may pack a smaller job beside a larger one."""
    example = Path(__file__).resolve().parents[2] / "examples" / "cluster_jobs.toml"
    args = ["cluster", "simulate", "--jobs-file", str(example), "--json"]
    assert main([*args, "--policy", "fifo,lucid,gimbal"]) == 0
    fifo, lucid, gimbal = json.loads(capsys.readouterr().out)
    assert lucid["mean_jct_s"] == fifo["mean_jct_s"]  # equal sizes only: nothing to pack
    assert gimbal["mean_jct_s"] < 0.8 * fifo["mean_jct_s"] and gimbal["packed_device_s"] > 0
    assert main([*args, "--trace", str(example)]) == 2
    assert "not both" in capsys.readouterr().err


def _profile_dir(tmp_path: Path) -> Path:
    """A profile folder as `legato cluster profile` writes it, with made-up rates: type
    'small' at 20 steps/s alone, 9 each when two share a device."""
    folder = tmp_path / "profile"
    (folder / "profiles").mkdir(parents=True)
    key = "('small (batch size 4)', 1)"
    table = {"cpu": {key: {"null": 20.0, key: [9.0, 9.0]},
                     "('small (batch size 4)', 2)": {"null": 30.0}}}  # fmt: skip
    (folder / "colocation.json").write_text(json.dumps(table))
    (folder / "profiles" / "small.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,2,0.03,0\n1,4,0.05,0\n1,8,0.09,0\n"
    )
    meta = {"device": "cpu", "cores_per_device": 1, "window_s": 1, "startup_s": 4.0, "types": {}}
    (folder / "profile.json").write_text(json.dumps(meta))
    return folder


JOBS = """
[cluster]
nodes = 1
devices_per_node = 2

[type.small]
batch = 4
[type.small.config.data]
seq_len = 32

[[job]]
name = "a"
type = "small"
workers = 2
steps = 200

[[job]]
name = "b"
type = "small"
workers = 1
steps = 100
arrival_s = 2
"""


def test_simulate_a_legato_mix_from_its_profile(tmp_path, capsys):
    """The jobs file `cluster run` takes is simulated from the profile, start-up included:
    job b waits for a (2 workers fill both devices) and then runs alone."""
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(JOBS)
    profile = _profile_dir(tmp_path)
    args = ["cluster", "simulate", "--jobs-file", str(jobs), "--profile", str(profile)]
    assert main([*args, "--policy", "fifo", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    a_s = 4.0 + 200 / 15.0  # start-up + steps at 30/2 steps/s
    b_s = 4.0 + 100 / 20.0
    assert abs(row["makespan_s"] - (a_s + b_s)) < 0.5
    assert row["restarts"] == 0


def test_run_refuses_bad_input_before_starting_anything(tmp_path, capsys):
    profile = _profile_dir(tmp_path)
    out = tmp_path / "out"
    jobs = tmp_path / "jobs.toml"
    cases = {
        JOBS: ("--policy", "best", "unknown policy 'best'"),
        JOBS.replace("workers = 2", "workers = 3"): ("", "", "needs 3 devices, the cluster has 2"),
        JOBS.replace("seq_len = 32", "seq_len = 32\n[type.small.config.train]\nsteps = 5"): (
            "", "", "type.small.config.train.steps: set by the cluster"),
        JOBS.replace("[type.small]\nbatch = 4", "[type.small]\nbatch = 0"): (
            "", "", "type.small.batch: must be an integer >= 1"),
        JOBS.replace('type = "small"\nworkers = 1', 'type = "big"\nworkers = 1'): (
            "", "", "unknown job type 'big'"),
    }  # fmt: skip
    for text, (flag, value, message) in cases.items():
        jobs.write_text(text)
        extra = [flag, value] if flag else []
        args = ["cluster", "run", str(jobs), "--profile", str(profile), "--out", str(out)]
        assert main([*args, *extra]) == 2, message
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    assert not out.exists()
    assert main(["cluster", "run", str(jobs), "--profile", str(tmp_path / "none")]) == 2
    assert "not a `legato cluster profile` folder" in capsys.readouterr().err
