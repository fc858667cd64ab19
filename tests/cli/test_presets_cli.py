"""`legato models` and `legato hardware`, run in-process."""

from __future__ import annotations

import json

import pytest

from legato.cli import main as cli
from legato.specs import list_clusters, list_devices, list_models


@pytest.fixture(autouse=True)
def only_presets_group(monkeypatch):
    """Register just this command group: the test covers it, not the other groups."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("presets",))


def test_models_json(capsys):
    assert cli.main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == list_models()
    by_name = {row["name"]: row for row in rows}
    mixtral = by_name["mixtral-8x7b"]
    assert mixtral["params"]["total"] == 46_702_792_704
    assert mixtral["params"]["active"] < mixtral["params"]["total"] / 3
    assert abs(mixtral["published_diff_pct"]) < 1
    assert by_name["tiny"]["published_params"] is None
    assert by_name["tiny"]["spec"]["num_kv_heads"] == 2


def test_models_table_and_files(capsys, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                "vocab_size": 300, "seq_len": 32}))  # fmt: skip
    assert cli.main(["models", "tiny-moe", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tiny-moe" in out and "mine" in out and "4/2" in out


def test_hardware_json(capsys):
    assert cli.main(["hardware", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data["devices"]] == list_devices()
    assert [c["name"] for c in data["clusters"]] == list_clusters()
    dgx = next(c for c in data["clusters"] if c["name"] == "dgx-h100")
    assert [lv["bandwidth_gbps"] for lv in dgx["levels"]] == [450, 50]


def test_hardware_table_with_nodes(capsys):
    assert cli.main(["hardware", "dgx-a100", "--nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 x 8" in out and "a100-80g" in out and "h100" not in out


@pytest.mark.parametrize("argv", [["models", "llama9"], ["hardware", "dgx-z"]])
def test_unknown_preset_exits_2(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("legato: error: unknown") and err.count("\n") == 1


def test_hardware_marks_unfitted_profile_laws(capsys, tmp_path):
    """A device without micro data keeps datasheet priors, marked unfitted in `legato
    hardware`; a device whose micro data fitted some laws names only the others."""
    from legato.devices.registry import shipped_profile

    assert cli.main(["hardware", "--json"]) == 0
    devices = {d["name"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
    assert devices["a100-80g"]["unfitted"] == shipped_profile("a100-80g").unfitted()
    assert "gemm.bf16" not in devices["a100-80g"]["unfitted"]
    assert "collectives.inter_node" in devices["a100-80g"]["unfitted"]
    rtx = devices["rtx4090"]
    assert len(rtx["unfitted"]) == rtx["profile_laws"] > 0  # no micro data: all priors
    assert cli.main(["hardware", "dgx-a100", "rtx4090-pcie"]) == 0
    out = capsys.readouterr().out
    assert "unfitted" in out and "all (datasheet priors)" in out and "host.launch" in out
    # a device of the user's own: its priors, all unfitted
    path = tmp_path / "mine.toml"
    path.write_text(
        'nodes = 1\ndevices_per_node = 2\n[device]\nname = "z1"\n'
        "peak_tflops = {bf16 = 100.0}\nmemory_gib = 16.0\nmemory_bandwidth_gbps = 800.0\n"
        'link = {name = "PCIe", bandwidth_gbps = 25.0, latency_us = 5.0}\n'
    )
    assert cli.main(["hardware", str(path), "--json"]) == 0
    (mine,) = json.loads(capsys.readouterr().out)["devices"]
    assert mine["name"] == "z1" and len(mine["unfitted"]) == mine["profile_laws"]
