"""Validation on the held-out split: trainer records, `legato eval`, and a direct computation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from legato.cli.main import main
from legato.data import PackedDataset
from legato.train.config import load_config
from legato.train.evaluate import WholeModel, evaluate, trained_eval_set
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


SEQ, VOCAB = 4, 11


def test_a_rank_whose_share_ran_out_pads_without_touching_real_tokens() -> None:
    """3 windows over 2 ranks, one window per batch: rank 1 evaluates window 2, then pads
    with an ignored window while rank 0 runs its second (the README run's IndexError)."""
    torch.manual_seed(0)
    model = torch.nn.Embedding(VOCAB, VOCAB)
    dataset = PackedDataset(np.arange(3 * SEQ + 1) % VOCAB, SEQ, seed=0, shuffle=False)
    result = evaluate(WholeModel(model), dataset, 1, device=torch.device("cpu"), rank=1, world=2)
    inputs, labels = dataset.windows(np.array([2]))
    with torch.no_grad():
        direct = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten()).item()
    assert result.tokens == SEQ and result.loss == pytest.approx(direct)


class _Cached(PackedDataset):
    """Serves the same tensors on every call, as a dataset with a cache may."""

    def windows(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if not hasattr(self, "served"):
            self.served = super().windows(indices)
        return self.served


def test_evaluate_does_not_change_the_datasets_tensors() -> None:
    dataset = _Cached(np.arange(SEQ + 1) % VOCAB, SEQ, seed=0, shuffle=False)
    dataset.windows(np.array([0]))
    inputs, labels = (t.clone() for t in dataset.served)
    evaluate(WholeModel(torch.nn.Embedding(VOCAB, VOCAB)), dataset, 1, device=torch.device("cpu"),
             rank=1, world=2, all_reduce=lambda sums: sums.add_(1))  # fmt: skip
    assert torch.equal(dataset.served[0], inputs) and torch.equal(dataset.served[1], labels)
