"""Fixtures of the training tests: one uninterrupted run whose checkpoints others resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.train.config import load_config
from legato.train.trainer import Trainer, TrainResult


@pytest.fixture(scope="session")
def full_run(
    small_train_args, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, TrainResult]:
    """6 uninterrupted steps in one process, a checkpoint every 3 (both kept).

    Tests copy its checkpoints before damaging or resuming them in their own directory.
    """
    run = tmp_path_factory.mktemp("full") / "run"
    args = small_train_args(run, "--checkpoint.every=3", "--checkpoint.keep=5")
    return run, Trainer(load_config(None, args)).fit()
