"""``legato serve simulate`` end to end in-process: one small S-LoRA-workload run prints one
JSON object under ``legato bench serve``'s names plus the pool's, and a bad flag is one
error line, never a traceback."""

from __future__ import annotations

import json

import pytest

from legato.cli.main import main

SMALL = ["serve", "simulate", "--model", "llama2-7b", "--device", "a100-80g",
         "--num-adapters", "20", "--adapter-rank", "8", "--workload", "slora", "--rate", "4",
         "--duration", "3", "--input-len", "8:64", "--output-len", "8:32"]  # fmt: skip


def test_a_small_slora_run_prints_the_bench_serve_figures(capsys):
    assert main([*SMALL, "--policy", "slora", "--json"]) == 0
    out = capsys.readouterr()
    (line,) = out.out.splitlines()
    result = json.loads(line)
    for key in ("request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "adapter_loads", "kv_hit_rate", "policy", "note"):  # fmt: skip
        assert key in result
    assert result["policy"] == "slora" and result["completed"] > 0
    assert out.err == ""  # --json: no note on stderr


@pytest.mark.parametrize(
    "flag", [["--input-len", "64:8"], ["--rate", "-1"], ["--tp", "0"], ["--instruction-len", "-1"]]
)
def test_a_bad_flag_is_one_line(capsys, flag):
    assert main([*SMALL, *flag, "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("legato: error: --")


def test_an_ablation_of_elora_is_a_policy_by_name(capsys):
    assert main([*SMALL, "--policy", "elora-lru", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "elora-lru"
