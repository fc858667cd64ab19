"""``benchmarks/gpu/run_all.sh --dry-run``: the GPU readiness checks' CPU path in CI.

The dry run calls the same check functions as the GPU run, with gloo for NCCL, one
stream for two and tiny shapes, and writes the same JSON: a check that breaks on the CPU
(an API renamed, a shape rule changed) fails here before anyone rents a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKS = {"process_group", "cuda_streams", "gemm_bf16", "gemm_fp8", "moe_overlap", "multi_lora"}


def test_dry_run_writes_every_check_ok(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "gpu" / "run_all.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(script), "--dry-run", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "readiness.json").read_text())
    assert set(report) == {"device", "dry_run", "elapsed_s", "ok", "rows"}
    assert report["dry_run"] and report["ok"]
    assert {row["case"]["check"] for row in report["rows"]} == CHECKS
    for row in report["rows"]:
        assert row["ok"] and row["benchmark"] == "gpu_readiness" and row["value"] is not None
