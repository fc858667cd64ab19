"""Fixtures shared by every test package: run directories, a small corpus.

Multi-process tests run their ranks through ``gloo_harness.run_ranks`` (this directory is on
``sys.path`` because this conftest lives here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh, not yet created, directory for one training run's outputs."""
    return tmp_path / "run"


@pytest.fixture(scope="session", autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Host calibrations of this session (``legato train`` measures the host once per
    process count) go to a session directory, never the user's cache."""
    from legato.train.prediction import CACHE_ENV

    path = tmp_path_factory.mktemp("calibrations")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if before is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session, so tokenised data is built once."""
    return tmp_path_factory.mktemp("legato-cache")


@pytest.fixture(scope="session")
def small_corpus(data_cache: Path) -> Path:
    """About 200 kB of the built-in corpus as a .txt file: enough for short training runs."""
    from legato.data import builtin_corpus_path

    return builtin_corpus_path(data_cache, seed=0, target_bytes=200_000)


# A model small enough that a training step takes milliseconds and a launch seconds.
SMALL_MODEL = (
    "{num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 1, "
    "ffn_hidden_size = 128, vocab_size = 258, seq_len = 64}"
)


@pytest.fixture(scope="session")
def small_train_args(data_cache: Path, small_corpus: Path):
    """``--section.key=value`` overrides for a seconds-long run of a small model.

    Call it with the run directory and any further overrides (later ones win).
    """

    def make(run_dir: Path, *extra: str) -> list[str]:
        return [
            f"--model.overrides={SMALL_MODEL}",
            f"--data.paths=['{small_corpus}']",
            f"--data.cache_dir={data_cache}",
            "--train.steps=6",
            "--train.global_batch_size=8",
            "--train.micro_batch_size=4",
            "--train.log_every=100",
            "--optim.warmup_steps=2",
            "--checkpoint.every=0",
            f"--run.dir={run_dir}",
            *extra,
        ]

    return make
