"""Checkpoints in one process: exact resume, pruning, and one-line errors for bad ones."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from legato.errors import CheckpointError
from legato.train.config import load_config
from legato.train.rng import capture_rng, restore_rng
from legato.train.trainer import Trainer, TrainResult


def _fit(args: list[str]) -> TrainResult:
    return Trainer(load_config(None, args)).fit()


@pytest.fixture(scope="module")
def full_run(
    small_train_args, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, TrainResult]:
    """6 uninterrupted steps, a checkpoint every 3 (both kept)."""
    run = tmp_path_factory.mktemp("full") / "run"
    result = _fit(small_train_args(run, "--checkpoint.every=3", "--checkpoint.keep=5"))
    return run, result


def test_resume_continues_exactly(full_run, small_train_args, run_dir: Path) -> None:
    full_dir, full = full_run
    step3 = full_dir / "checkpoints" / "step_000003"
    resumed = _fit(small_train_args(run_dir, f"--checkpoint.resume={step3}"))
    assert resumed.steps == [4, 5, 6]
    assert resumed.losses == full.losses[3:]  # bit for bit: same weights, moments, lr, data


def test_checkpoint_layout_and_meta(full_run) -> None:
    root = full_run[0] / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_000006"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000003", "step_000006"]
    meta = json.loads((root / "step_000006" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["world_size"] == 1 and meta["legato_version"]
    assert meta["model_spec"]["hidden_size"] == 64 and meta["config"]["train"]["steps"] == 6
    assert meta["data"]["fingerprint"] and meta["scheduler"]["last_epoch"] == 6
    for name in (".metadata", "rng_rank0.json"):
        assert meta["files"][name] == (root / "step_000006" / name).stat().st_size


def test_auto_resume_in_the_run_dir_and_pruning(small_train_args, run_dir: Path) -> None:
    first = _fit(small_train_args(run_dir, "--train.steps=4", "--checkpoint.every=1"))
    assert first.steps == [1, 2, 3, 4]
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000004"]
    again = _fit(small_train_args(run_dir, "--train.steps=6", "--checkpoint.every=2"))
    assert again.steps == [5, 6]
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    fresh = _fit(small_train_args(run_dir, "--train.steps=2", "--checkpoint.resume=none"))
    assert fresh.steps == [1, 2] and fresh.losses == first.losses[:2]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


CORRUPTIONS = {
    "missing .metadata": (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
    "garbled .metadata": (lambda d: _garble(d / ".metadata"), "DCP .metadata is unreadable"),
    "truncated shard": (lambda d: _truncate(d / "__0_0.distcp"), "truncated"),
    "missing meta.json": (lambda d: (d / "meta.json").unlink(), "no meta.json"),
    "garbled meta.json": (lambda d: (d / "meta.json").write_text("{"), "corrupt JSON"),
    "foreign meta.json": (lambda d: (d / "meta.json").write_text("{}"), "not a legato checkpoint"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_checkpoint_is_one_line_error(
    case: str, full_run, small_train_args, tmp_path: Path
) -> None:
    damage, message = CORRUPTIONS[case]
    ckpt = shutil.copytree(full_run[0] / "checkpoints" / "step_000003", tmp_path / "ckpt")
    damage(ckpt)
    with pytest.raises(CheckpointError) as info:
        _fit(small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}"))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_garbled_shard_with_consistent_sizes(full_run, small_train_args, tmp_path: Path) -> None:
    """Sizes match but the bytes are garbage: DCP's own read fails, still one line."""
    ckpt = shutil.copytree(full_run[0] / "checkpoints" / "step_000003", tmp_path / "ckpt")
    _garble(ckpt / "__0_0.distcp")
    with pytest.raises(CheckpointError, match="cannot be read") as info:
        _fit(small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}"))
    assert "\n" not in str(info.value)


def test_dangling_latest_pointer(full_run, small_train_args, tmp_path: Path) -> None:
    run = shutil.copytree(full_run[0], tmp_path / "run")
    (run / "checkpoints" / "latest").write_text("step_000999\n")
    with pytest.raises(CheckpointError, match=r"step_000999.*not a checkpoint"):
        _fit(small_train_args(run))


def test_missing_resume_path(small_train_args, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"checkpoint\.resume: no checkpoint at"):
        _fit(small_train_args(tmp_path / "run", f"--checkpoint.resume={tmp_path / 'nope'}"))


def test_other_model_names_the_first_differing_field(
    full_run, small_train_args, tmp_path: Path
) -> None:
    ckpt = full_run[0] / "checkpoints" / "step_000003"
    args = small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}")
    with pytest.raises(
        CheckpointError, match="at ffn_hidden_size: checkpoint has 128, config has 96"
    ):
        _fit([*args, "--model.overrides.ffn_hidden_size=96"])


def test_other_data_is_refused(full_run, small_train_args, tmp_path: Path) -> None:
    other = tmp_path / "other.txt"
    other.write_text("a different corpus entirely\n\n" * 2000)
    ckpt = full_run[0] / "checkpoints" / "step_000003"
    args = small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}")
    with pytest.raises(CheckpointError, match="another dataset") as info:
        _fit([*args, f"--data.paths=['{other}']"])
    assert "\n" not in str(info.value)


def test_rng_states_round_trip_through_json() -> None:
    state = json.loads(json.dumps(capture_rng(torch.device("cpu"))))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])
