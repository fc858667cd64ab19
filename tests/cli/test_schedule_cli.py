"""``legato schedule``: simulate (table, JSON, files), pareto, check, one-line errors."""

from __future__ import annotations

import json
import struct

import pytest

from legato.cli import main as cli


@pytest.fixture(autouse=True)
def only_schedule_group(monkeypatch):
    """Run the real ``main`` with just this command group registered."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("schedule",))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["schedule", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_has_bubble_peak_and_makespan(capsys) -> None:
    code, out, _ = run(capsys, "simulate", "--schedule", "1f1b", "--stages", "4",
                       "--microbatches", "8", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0
    assert data["bubble_ratio"]["per_rank"] == pytest.approx([3 / 11] * 4)
    assert data["bubble_ratio"]["max"] == data["bubble_ratio"]["mean"] == pytest.approx(3 / 11)
    assert data["peak_activation"]["per_rank"] == [1.0, 0.75, 0.5, 0.25]
    assert data["makespan"] == 33.0


def test_simulate_svpp_writes_trace_png_and_schedule(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "simulate", "--schedule", "svpp", "--stages", "4",
                       "--microbatches", "8", "--chunks", "2", "--slices", "2",
                       "--memory-cap", "8", "--cost", "f=1,b=1,w=1,latency=0.01",
                       "--png", str(tmp_path / "t.png"), "--trace", str(tmp_path / "t.json"),
                       "--save", str(tmp_path / "s.json"))  # fmt: skip
    assert code == 0
    assert "svpp: p=4 m=8 v=2 k=2" in out and "peak / 1F1B" in out
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads((tmp_path / "t.json").read_text())["traceEvents"]) > 4 * 8 * 2 * 2 * 3
    code, out, _ = run(capsys, "check", str(tmp_path / "s.json"))
    assert code == 0 and "ok (" in out


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_long_timeline_png_is_wrapped_and_its_path_printed(capsys, tmp_path) -> None:
    """A 64-micro-batch timeline was one 6,600-pixel strip; it is now cut into rows of at
    most 14 inches at 110 dpi, and the command says where the file went."""
    png = tmp_path / "long.png"
    code, out, err = run(capsys, "simulate", "--schedule", "1f1b", "--stages", "4",
                         "--microbatches", "64", "--png", str(png), "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["makespan"] > 0
    assert f"wrote timeline PNG: {png}" in err
    width, height = _png_size(png)
    assert width <= 14 * 110 and 600 < height <= 12 * 110
    code, out, _ = run(capsys, "simulate", "--schedule", "1f1b", "--stages", "4",
                       "--microbatches", "4", "--png", str(tmp_path / "short.png"))  # fmt: skip
    assert code == 0 and f"wrote timeline PNG: {tmp_path / 'short.png'}" in out
    assert _png_size(tmp_path / "short.png")[1] < 600  # a short one stays a single row


def test_check_reports_problems_of_a_broken_file(capsys, tmp_path) -> None:
    run(capsys, "simulate", "--schedule", "seq1f1b", "--stages", "2", "--microbatches", "2",
        "--slices", "2", "--save", str(tmp_path / "s.json"))  # fmt: skip
    data = json.loads((tmp_path / "s.json").read_text())
    data["ranks"][1].remove("RECV_F1.1@1")
    (tmp_path / "s.json").write_text(json.dumps(data))
    code, out, _ = run(capsys, "check", str(tmp_path / "s.json"))
    assert code == 1
    assert "SEND_F1.1@0 on rank 0 has no matching RECV_F1.1@1 on rank 1" in out


def test_pareto_writes_png_and_json(capsys, tmp_path) -> None:
    code, out, _ = run(capsys, "pareto", "--stages", "4", "--microbatches", "4",
                       "--chunks", "2", "--slices", "1,2", "--png", str(tmp_path / "p.png"),
                       "--json", str(tmp_path / "p.json"))  # fmt: skip
    assert code == 0 and "Pareto front" in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["front"] and data["microbatches"] == 4
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--schedule", "svpp", "--chunks", "2", "--slices", "2", "--memory-cap", "3"],
         "memory_cap: 3 slice units is below the dependency floor v*k = 2*2 = 4 for device 0"),
        (["--schedule", "gpipe", "--chunks", "2"], "chunks: gpipe does not take it"),
        (["--schedule", "1f1b", "--cost", "f=0"], "cost.f: must be > 0, got 0.0"),
        (["--schedule", "1f1b", "--cost", "speed=2"], "cost: expected name=value"),
    ],
)  # fmt: skip
def test_user_errors_are_one_line(capsys, argv, message) -> None:
    code, _, err = run(capsys, "simulate", "--stages", "4", "--microbatches", "8", *argv)
    assert code == 2
    assert err.startswith(f"legato: error: {message}")
    assert err.count("\n") == 1
