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
