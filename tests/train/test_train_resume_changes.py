"""Resuming with changed settings: applied and recorded, or refused with one line."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from legato.errors import CheckpointError
from legato.train.config import OptimSection, TrainConfig, load_config
from legato.train.optim import ScheduleSegment
from legato.train.resume import (
    CHANGEABLE,
    CHECKED_BY_CONTENT,
    FIXED,
    config_fields,
    read_invocations,
)
from legato.train.trainer import Trainer

# small_train_args' schedule: optim.lr 3e-3 (the default), warm-up 2, 6 steps
BASE = OptimSection(warmup_steps=2)


def _lrs(run: Path) -> dict[int, float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["lr"] for r in map(json.loads, lines)}


def _resume_copy(full_run, tmp_path: Path) -> Path:
    """A copy of the 6-step run; its checkpoints are steps 3 and 6 (latest)."""
    return shutil.copytree(full_run[0], tmp_path / "run")


def test_every_config_field_has_a_resume_rule() -> None:
    """A new config field must say whether a resume may change it."""
    fields = set(config_fields(TrainConfig().to_dict()))
    assert set(FIXED) | CHECKED_BY_CONTENT | CHANGEABLE == fields
    assert len(FIXED) + len(CHECKED_BY_CONTENT) + len(CHANGEABLE) == len(fields)


def test_extending_the_steps_keeps_the_learning_rate_continuous(
    full_run, small_train_args, tmp_path: Path
) -> None:
    """From step 3 of 6 to 10 steps: step 4 runs at exactly the lr it had in the 6-step
    run (not the 10-step schedule's, the old jump), then a cosine to the minimum at 10."""
    step3 = full_run[0] / "checkpoints" / "step_000003"
    run = tmp_path / "run"
    result = Trainer(
        load_config(None, small_train_args(run, f"--checkpoint.resume={step3}", "--train.steps=10"))
    ).fit()
    assert result.steps == [4, 5, 6, 7, 8, 9, 10]
    old, new = _lrs(full_run[0]), _lrs(run)
    assert new[4] == old[4]
    assert new[4] != ScheduleSegment.first(BASE, 10).lr(3)  # what a fresh 10-step plan says
    lrs = [new[s] for s in range(4, 11)]
    assert all(b < a for a, b in itertools.pairwise(lrs))
    assert new[10] == pytest.approx(BASE.lr * BASE.min_lr_ratio, rel=1e-12)
    assert read_invocations(run)[0]["changed"]["train.steps"] == [6, 10]


def test_extending_a_finished_run_holds_the_final_rate(
    full_run, small_train_args, tmp_path
) -> None:
    run = _resume_copy(full_run, tmp_path)
    Trainer(load_config(None, small_train_args(run, "--train.steps=8"))).fit()
    lrs = _lrs(run)
    assert lrs[7] == lrs[8] == pytest.approx(lrs[6], rel=1e-12)


def test_a_changed_lr_and_optimizer_settings_are_applied_and_recorded(
    full_run, small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step3 = full_run[0] / "checkpoints" / "step_000003"
    run = tmp_path / "run"
    changed = ("--optim.lr=0.01", "--optim.weight_decay=0.2", "--optim.beta2=0.99")
    args = small_train_args(run, f"--checkpoint.resume={step3}", "--checkpoint.every=1", *changed)
    trainer = Trainer(load_config(None, args))
    result = trainer.fit()
    old, new = _lrs(full_run[0]), _lrs(run)
    assert new[4] == pytest.approx(old[4] * 0.01 / 3e-3, rel=1e-12)  # scaled, then annealed
    assert new[6] == pytest.approx(0.01 * BASE.min_lr_ratio, rel=1e-12)
    decay, no_decay = trainer.optimizer.param_groups
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert decay["betas"] == no_decay["betas"] == (0.9, 0.99)
    assert result.losses[1:] != full_run[1].losses[4:]  # the new settings really trained
    out = capsys.readouterr().out
    assert "changed: optim.lr 0.003 -> 0.01, optim.weight_decay 0.1 -> 0.2" in out
    [entry] = read_invocations(run)
    assert entry["start_step"] == 3 and entry["resumed_from"] == str(step3)
    assert entry["changed"]["optim.lr"] == [0.003, 0.01]
    # The changed schedule is in the checkpoint: resuming step 5 again reproduces step 6.
    (run / "checkpoints" / "latest").write_text("step_000005\n")
    again = Trainer(load_config(None, small_train_args(run, "--checkpoint.every=1", *changed)))
    assert again.fit().losses == result.losses[-1:]
    assert _lrs(run)[6] == new[6]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "--train.seed=1",
            "train.seed cannot change on resume (it fixes the data order): "
            "the checkpoint has 0, this run 1",
        ),
        ("--train.global_batch_size=4", "train.global_batch_size cannot change on resume"),
        ("--train.dtype=bf16", "the checkpoint has 'fp32', this run 'bf16'"),
        ("--data.seq_len=32", "data.seq_len cannot change on resume"),
    ],
)
def test_a_fixed_field_is_refused_naming_both_values(
    override: str, message: str, full_run, small_train_args, tmp_path: Path
) -> None:
    run = _resume_copy(full_run, tmp_path)
    with pytest.raises(CheckpointError) as info:
        Trainer(load_config(None, small_train_args(run, "--train.steps=8", override))).fit()
    text = str(info.value)
    assert message in text and "\n" not in text
    assert text.startswith(f"checkpoint {run / 'checkpoints' / 'step_000006'}: ")


def test_the_same_seq_len_written_differently_is_no_change(
    full_run, small_train_args, tmp_path: Path
) -> None:
    run = _resume_copy(full_run, tmp_path)
    Trainer(load_config(None, small_train_args(run, "--train.steps=7", "--data.seq_len=64"))).fit()
    assert "data.seq_len" not in read_invocations(run)[-1]["changed"]


def test_the_run_directory_keeps_every_invocation(small_train_args, run_dir: Path) -> None:
    first = small_train_args(run_dir, "--train.steps=4", "--checkpoint.every=2")
    Trainer(load_config(None, first)).fit()
    second = small_train_args(
        run_dir, "--train.steps=6", "--checkpoint.every=2", "--optim.lr=0.002"
    )
    Trainer(load_config(None, second)).fit()
    assert load_config(run_dir / "config.toml") == load_config(None, first)  # the first, unchanged
    one, two = read_invocations(run_dir)
    assert (one["invocation"], one["start_step"], one["changed"]) == (1, 0, {})
    assert (two["invocation"], two["start_step"]) == (2, 4)
    assert two["changed"] == {"optim.lr": [0.003, 0.002], "train.steps": [4, 6]}
    assert two["config"] == load_config(None, second).to_dict()
    assert two["resumed_from"] == str(run_dir / "checkpoints" / "step_000004")
