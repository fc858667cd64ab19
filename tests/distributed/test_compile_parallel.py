"""``train.compile`` under the parallelisms it runs with on 2 processes: tp with sp, cp and
ep (the routed experts run eagerly inside a compiled block) train as eager blocks do.

One launch trains each strategy eager and compiled (``aot_eager``: dynamo's trace and
AOTAutograd's graphs, eager kernels) for two steps and compares the losses and the
gradient norms, which a missed or doubled term of the compiled graph would change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gloo_harness import run_ranks
from legato.train.config import load_config
from legato.train.trainer import Trainer

pytestmark = pytest.mark.distributed

RTOL = 1e-6  # aot_eager runs the eager kernels in the eager order (seen: equal losses)
SMALL = "num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2, seq_len = 64"
ROWS = {
    "tp=2 sp": ("tiny", "tp=2,sp=1"),
    "cp=2": ("tiny", "cp=2"),
    "moe ep=2": ("tiny-moe", "ep=2"),
}


def _train(rank: int, runs: dict[str, list[str]]) -> dict[str, list[dict]]:
    out = {}
    for name, args in runs.items():
        Trainer(load_config(None, args)).fit()
        lines = (Path(args[-1].split("=", 1)[1]) / "metrics.jsonl").read_text().splitlines()
        out[name] = [json.loads(line) for line in lines]
    return out


def test_compiled_blocks_train_as_eager_under_tp_cp_and_ep(small_train_args, tmp_path) -> None:
    runs = {}
    for row, (preset, strategy) in ROWS.items():
        for compiled in (False, True):
            extra = (
                ("--train.compile=true", "--train.compile_backend=aot_eager") if compiled else ()
            )
            name = f"{row} {'compiled' if compiled else 'eager'}"
            runs[name] = [
                *small_train_args(tmp_path / name, "--train.steps=2", "--parallel.nproc=2"),
                f"--model.preset={preset}",
                f"--model.overrides={{{SMALL}}}",
                f"--parallel.strategy={strategy}",
                *extra,
                f"--run.dir={tmp_path / name}",
            ]
    [records, _] = run_ranks(_train, runs, timeout_s=600)
    for row in ROWS:
        eager, compiled = records[f"{row} eager"], records[f"{row} compiled"]
        for want, got in zip(eager, compiled, strict=True):
            assert got["loss"] == pytest.approx(want["loss"], rel=RTOL), row
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=RTOL), row
