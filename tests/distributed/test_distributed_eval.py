"""Validation under pp, cp and tp: 2 gloo ranks report the one-process validation loss.

The token-weighted mean is the sum of every token's loss over the count of label tokens,
each counted once: the last pipeline stage holds the loss, each cp rank its zigzag share
of every window, the first tp rank the tokens its group shares. A layout that counted a
rank twice or missed one would report another token count (checked exactly) or a mean
over a part of the windows (off by far more than fp32 rounding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gloo_harness import run_ranks
from legato.train.config import load_config
from legato.train.trainer import Trainer

pytestmark = pytest.mark.distributed

LAYOUTS = {"pp": "pp=2", "cp": "cp=2", "tp": "tp=2"}
# two training steps before the second evaluation: the layouts' fp32 rounding (seen 1e-7)
LOSS_RTOL = 1e-5
# the small model with a KV head per tp rank
MODEL = (
    "{num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2, "
    "ffn_hidden_size = 128, vocab_size = 258, seq_len = 64}"
)
EVAL_ARGS = (
    f"--model.overrides={MODEL}",
    "--train.steps=2",
    "--train.eval_every=1",
    "--data.holdout=0.05",
)


def _evals(run_dir: Path) -> list[tuple[int, float, int]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["step"], r["val_loss"], r["val_tokens"]) for r in records if "val_loss" in r]


def _fit_layouts(rank: int, runs: dict[str, list[str]]) -> dict[str, list]:
    """A ``run_ranks`` worker: each layout's evaluations, read back from the metrics rank 0
    wrote."""
    for args in runs.values():
        Trainer(load_config(None, args)).fit()
    return (
        {name: _evals(Path(load_config(None, a).run.dir)) for name, a in runs.items()}
        if rank == 0
        else {}
    )


@pytest.fixture(scope="module")
def one_process(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> list:
    run = tmp_path_factory.mktemp("one") / "run"
    Trainer(load_config(None, small_train_args(run, "--parallel.nproc=1", *EVAL_ARGS))).fit()
    return _evals(run)


def test_validation_loss_under_pp_cp_and_tp_equals_one_process(
    one_process: list, small_train_args, tmp_path: Path
) -> None:
    runs = {
        name: small_train_args(tmp_path / name, f"--parallel.strategy={strategy}", *EVAL_ARGS)
        for name, strategy in LAYOUTS.items()
    }
    got = run_ranks(_fit_layouts, runs)[0]  # rank 0 writes the metrics
    assert [step for step, _, _ in one_process] == [1, 2]
    for name in LAYOUTS:
        for (step, loss, tokens), (_, want, want_tokens) in zip(
            got[name], one_process, strict=True
        ):
            assert tokens == want_tokens, f"{name} step {step}: {tokens} tokens"
            assert loss == pytest.approx(want, rel=LOSS_RTOL), f"{name} step {step}"
