"""`legato calibrate --quick` with 2 real gloo processes writes a cluster file whose link
was measured: positive latency and bandwidth, every collective timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legato.calibrate.cluster_file import read_measurement
from legato.cli import main as cli
from legato.cost.collectives import COLLECTIVES
from legato.specs import load_cluster

pytestmark = pytest.mark.distributed


def test_two_process_calibration(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("calibrate",))
    out = tmp_path / "local.toml"
    assert cli.main(["calibrate", "--quick", "--out", str(out)]) == 0
    printed, progress = capsys.readouterr()
    assert f"wrote {out}" in printed and "gloo link" in printed
    assert "calibrate [" in progress  # progress lines go to stderr

    cluster = load_cluster(out)
    assert cluster.world_size == 2
    link = cluster.levels[0]
    assert "measured" in link.name
    assert link.latency_us > 0 and link.bandwidth_gbps > 0
    m = read_measurement(out)
    assert m.nproc == 2 and m.link is not None
    assert {t.kind for t in m.comm} == set(COLLECTIVES)
    assert all(t.seconds > 0 and t.ranks == 2 for t in m.comm)
    assert json.loads(json.dumps(m.to_dict()))["link"]["bandwidth"] == m.link.bandwidth
