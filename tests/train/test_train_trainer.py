"""The training loop in one process: accumulation, learning, outputs, precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legato.errors import ConfigError
from legato.train.config import load_config
from legato.train.trainer import Trainer, TrainResult


def _fit(args: list[str]) -> TrainResult:
    return Trainer(load_config(None, args)).fit()


def test_grad_accumulation_equals_one_big_micro_batch(small_train_args, tmp_path: Path) -> None:
    """micro 2 x accum 2 must give the losses of micro 4 x accum 1 (same global batch)."""
    common = ("--parallel.nproc=1", "--train.global_batch_size=4", "--train.steps=5")
    whole = _fit(small_train_args(tmp_path / "a", *common, "--train.micro_batch_size=4"))
    split = _fit(small_train_args(tmp_path / "b", *common, "--train.micro_batch_size=2"))
    assert whole.steps == split.steps == [1, 2, 3, 4, 5]
    # Summation order differs between the splits: fp32 rounding, nothing more.
    assert split.losses == pytest.approx(whole.losses, abs=1e-5, rel=0)
    assert whole.losses[0] != whole.losses[-1]  # the weights really changed in between


def test_loss_falls_and_outputs_are_written(small_train_args, run_dir: Path) -> None:
    result = _fit(small_train_args(run_dir, "--train.steps=30", "--checkpoint.every=0"))
    assert result.run_dir == run_dir
    assert sum(result.losses[-5:]) / 5 < result.losses[0] - 1.0, result.losses
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    assert [r["loss"] for r in records] == result.losses
    for r in records:
        assert r["tokens"] == 8 * 64 and r["tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0
        assert 0 < r["mfu"] < 1 and r["grad_norm"] > 0 and r["lr"] > 0
    assert (run_dir / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_loss"] == result.losses[-1] and summary["steps"] == 30
    assert summary == result.summary
    assert load_config(run_dir / "config.toml") == load_config(
        None, small_train_args(run_dir, "--train.steps=30", "--checkpoint.every=0")
    )


def test_bf16_autocast_tracks_fp32(small_train_args, tmp_path: Path) -> None:
    fp32 = _fit(small_train_args(tmp_path / "a", "--train.steps=3"))
    bf16 = _fit(small_train_args(tmp_path / "b", "--train.steps=3", "--train.dtype=bf16"))
    assert bf16.losses == pytest.approx(fp32.losses, abs=0.05)
    assert bf16.losses != fp32.losses  # bf16 matmuls really ran


def test_sequence_longer_than_the_model_is_a_config_error(small_train_args, run_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.seq_len: must be <= the model's seq_len \(64\)"):
        _fit(small_train_args(run_dir, "--data.seq_len=128"))


def test_set_batch_split_checks_before_it_is_taken(small_train_args, run_dir: Path) -> None:
    args = small_train_args(run_dir, "--parallel.nproc=1", "--train.steps=1")
    trainer = Trainer(load_config(None, [*args, "--parallel.cluster=none"]))
    with pytest.raises(ConfigError, match="set_batch_split needs the layout"):
        trainer.set_batch_split([8])
    trainer.fit()
    assert trainer.batch_split == [8]  # one process: the whole global batch
    with pytest.raises(ConfigError, match=r"one entry per data-parallel rank \(1\), got \[4, 4\]"):
        trainer.set_batch_split([4, 4])
    with pytest.raises(ConfigError, match="must be a list of integers"):
        trainer.set_batch_split([8.0])
    trainer.set_batch_split([8])
