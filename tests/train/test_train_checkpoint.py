"""Checkpoints in one process: exact resume, pruning, and one-line errors for bad ones."""

from __future__ import annotations

import hashlib
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
    assert set(meta["sha256"]) == set(meta["files"]) and meta["format"] == 3
    shard = (root / "step_000006" / "__0_0.distcp").read_bytes()
    assert meta["sha256"]["__0_0.distcp"] == hashlib.sha256(shard).hexdigest()


def test_auto_resume_in_the_run_dir_and_pruning(small_train_args, run_dir: Path) -> None:
    first = _fit(small_train_args(run_dir, "--train.steps=4", "--checkpoint.every=1"))
    assert first.steps == [1, 2, 3, 4]
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000003", "step_000004"]
    again = _fit(small_train_args(run_dir, "--train.steps=6", "--checkpoint.every=2"))
    assert again.steps == [5, 6]
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    fresh = _fit(small_train_args(run_dir, "--train.steps=2", "--run.fresh=true"))
    assert fresh.steps == [1, 2] and fresh.losses == first.losses[:2]
    assert sorted(p.name for p in root.glob("step_*")) == []  # checkpoint.every = 0


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def _overwrite_middle(path: Path, size: int = 8192) -> None:
    """8 KB of other bytes in the middle of the file: same size, DCP would load it."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2 - size // 2
    data[middle : middle + size] = bytes(b ^ 0x5A for b in data[middle : middle + size])
    path.write_bytes(bytes(data))


def _as_format_2(ckpt: Path) -> Path:
    """The checkpoint as legato wrote it before checksums: format 2, sizes only."""
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["sha256"]
    meta["format"] = 2
    (ckpt / "meta.json").write_text(json.dumps(meta))
    return ckpt


CORRUPTIONS = {
    "missing .metadata": (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
    "garbled .metadata": (
        lambda d: _garble(_as_format_2(d) / ".metadata"),
        "DCP .metadata is unreadable",
    ),
    "garbled .metadata, checksummed": (
        lambda d: _garble(d / ".metadata"),
        ".metadata is damaged (sha256 mismatch)",
    ),
    "checksum missing from the manifest": (
        lambda d: (d / "meta.json").write_text(
            (d / "meta.json").read_text().replace('"sha256"', '"sha"')
        ),
        "the manifest has no sha256 for every file",
    ),
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


def test_overwritten_shard_names_the_file(full_run, small_train_args, tmp_path: Path) -> None:
    """8 KB changed mid-shard, sizes intact: DCP alone would load it and train on (the
    loss jumped 3 -> 8); the checksum refuses it before DCP reads a byte."""
    run = shutil.copytree(full_run[0], tmp_path / "run")
    step6 = run / "checkpoints" / "step_000006"
    _overwrite_middle(step6 / "__0_0.distcp")
    with pytest.raises(CheckpointError) as info:
        _fit(small_train_args(run))  # resume = auto: the latest, step 6
    earlier = run / "checkpoints" / "step_000003"
    assert str(info.value) == (
        f"checkpoint {step6}: __0_0.distcp is damaged (sha256 mismatch); delete this "
        f"checkpoint or resume from an earlier one (checkpoint.resume = '{earlier}')"
    )


def test_format_2_checkpoint_resumes_with_a_note(
    full_run, small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint from before checksums still resumes exactly; the run says it could
    only check sizes."""
    ckpt = _as_format_2(
        shutil.copytree(full_run[0] / "checkpoints" / "step_000003", tmp_path / "ckpt")
    )
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["scheduler"] = {"last_epoch": 3, "base_lrs": [3e-3, 3e-3], "lr_lambdas": [None, None]}
    (ckpt / "meta.json").write_text(json.dumps(meta))  # torch's LambdaLR state, as then
    resumed = _fit(small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}"))
    assert resumed.losses == full_run[1].losses[3:]
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resumed from")]
    assert line.startswith(f"resumed from {ckpt} (step 3); changed: ")
    assert line.endswith(
        "; note: this checkpoint predates checksums, only its file sizes were checked"
    )


def test_garbled_shard_with_consistent_sizes(full_run, small_train_args, tmp_path: Path) -> None:
    """Sizes match but the bytes are garbage, in a checkpoint without checksums:
    DCP's own read fails, still one line."""
    ckpt = shutil.copytree(full_run[0] / "checkpoints" / "step_000003", tmp_path / "ckpt")
    _garble(_as_format_2(ckpt) / "__0_0.distcp")
    with pytest.raises(CheckpointError, match="cannot be read") as info:
        _fit(small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}"))
    assert "\n" not in str(info.value)


def _noted(capsys: pytest.CaptureFixture[str]) -> str:
    [line] = [x for x in capsys.readouterr().out.splitlines() if "newest intact" in x]
    return line


def test_dangling_latest_pointer_falls_back_to_the_newest_intact_checkpoint(
    full_run, small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(full_run[0], tmp_path / "run")
    latest = run / "checkpoints" / "latest"
    latest.write_text("step_000999\n")
    resumed = _fit(small_train_args(run, "--checkpoint.every=3", "--checkpoint.keep=5"))
    assert resumed.steps == []  # step 6 of 6: nothing left to train
    assert _noted(capsys) == (
        f"{latest}: points to 'step_000999', which is not a checkpoint; resuming from the "
        f"newest intact checkpoint, {run / 'checkpoints' / 'step_000006'}"
    )


def test_deleted_latest_resumes_the_newest_intact_checkpoint_and_keeps_the_run(
    full_run, small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting ``latest`` used to restart at step 0 in a folder full of checkpoints,
    rewriting the records and pruning the real checkpoints away."""
    full_dir, full = full_run
    run = shutil.copytree(full_dir, tmp_path / "run")
    root = run / "checkpoints"
    (root / "latest").unlink()
    _overwrite_middle(root / "step_000006" / "__0_0.distcp")  # the newest is damaged too
    resumed = _fit(small_train_args(run, "--checkpoint.every=3", "--checkpoint.keep=5"))
    assert resumed.steps == [4, 5, 6] and resumed.losses == full.losses[3:]
    assert _noted(capsys) == (
        f"{root / 'latest'} is missing; resuming from the newest intact checkpoint, "
        f"{root / 'step_000003'} (skipped damaged step_000006)"
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [json.loads(line)["start_step"] for line in (run / "invocations.jsonl").open()] == [0, 3]
    assert (root / "latest").read_text().strip() == "step_000006"


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
