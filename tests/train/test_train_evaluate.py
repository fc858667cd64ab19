"""Validation on the held-out split: trainer records, `legato eval`, and a direct computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from legato.cli.main import main
from legato.train.config import load_config
from legato.train.evaluate import trained_eval_set
from legato.train.trained_model import load_trained
from legato.train.trainer import Trainer


def test_eval_every_records_match_legato_eval_and_a_direct_loss(
    small_train_args, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run"
    args = small_train_args(
        run, "--parallel.nproc=1", "--data.holdout=0.02", "--train.eval_every=3",
        "--checkpoint.every=6",
    )  # fmt: skip
    Trainer(load_config(None, args)).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]
    capsys.readouterr()  # the trainer's own lines
    assert main(["eval", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["loss"] == pytest.approx(evals[-1]["val_loss"], rel=1e-6)
    trained = load_trained(run)
    windows = trained_eval_set(trained)
    inputs, labels = windows.windows(torch.arange(windows.num_sequences).numpy())
    with torch.no_grad():
        direct = F.cross_entropy(trained.model(inputs).flatten(0, 1), labels.flatten()).item()
    assert report["loss"] == pytest.approx(direct, rel=1e-6)
    assert report["tokens"] == labels.numel() == evals[-1]["val_tokens"]
