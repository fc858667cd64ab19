"""SIGTERM/SIGINT in one process: a clean stop at a step boundary, or during set-up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from legato.train.config import load_config
from legato.train.interrupt import Interrupted
from legato.train.trainer import Trainer


def signal_when(ready: Callable[[], bool], signum: int = signal.SIGTERM) -> threading.Thread:
    """Send ``signum`` to this process (its main thread handles it) once ``ready()``."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_a_signal_in_the_loop_checkpoints_the_step_and_reports(
    small_train_args, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    args = small_train_args(run_dir, "--train.steps=40", "--checkpoint.every=100")
    watcher = signal_when(lambda: steps_logged(run_dir) >= 2, signal.SIGINT)
    result = Trainer(load_config(None, args)).fit()
    watcher.join()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    stop = result.steps[-1]
    assert result.interrupted and 2 <= stop < 40 and result.steps == list(range(1, stop + 1))
    step_dir = run_dir / "checkpoints" / f"step_{stop:06d}"
    assert result.checkpoint == step_dir  # between checkpoint.every: saved anyway
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == step_dir.name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == stop
    assert (run_dir / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [
        f"legato: interrupted at step {stop}/40; checkpoint {step_dir} saved; to resume, "
        f"rerun with --run.dir={run_dir}"
    ]


def test_a_signal_during_set_up_stops_before_anything_is_written(
    small_train_args, tmp_path: Path
) -> None:
    """Training a BPE tokenizer takes a moment: the signal lands in set-up."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    model = "{num_layers = 1, hidden_size = 32, num_heads = 2, vocab_size = 512, seq_len = 64}"
    args = small_train_args(
        run,
        f"--data.cache_dir={cache}",
        "--data.tokenizer=bpe",
        "--data.bpe_vocab_size=512",
        f"--model.overrides={model}",
    )
    before = signal.getsignal(signal.SIGTERM)
    signal_when(run.is_dir)
    with pytest.raises(Interrupted, match="SIGTERM during set-up, before the first step"):
        Trainer(load_config(None, args)).fit()
    assert signal.getsignal(signal.SIGTERM) == before
    assert sorted(p.name for p in run.iterdir()) == []  # no config, metrics or checkpoint
    assert not [p for p in cache.rglob("*") if ".tmp" in p.name]  # atomic writes only


def test_the_command_in_one_process_exits_130_after_a_stop(small_train_args, run_dir: Path) -> None:
    """``legato train --parallel.nproc=1`` trains in its own process: same handlers."""
    command = [sys.executable, "-m", "legato.cli.main", "train", "--parallel.nproc=1"]
    args = small_train_args(run_dir, "--train.steps=40")
    proc = subprocess.Popen([*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while steps_logged(run_dir) < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("legato: interrupted at step "), lines
    assert (run_dir / "summary.json").is_file()


def test_a_signal_as_the_run_dir_lock_is_registered_still_removes_it(
    small_train_args, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is taken (``owned``'s enter) and then registered for release (the exit
    stack): a signal landing between the two must not leave the lock behind."""
    register = contextlib.ExitStack._push_cm_exit

    def signalled(self, cm, exit_fn):
        if getattr(getattr(cm, "gen", None), "__name__", "") == "owned":
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecode
        return register(self, cm, exit_fn)

    monkeypatch.setattr(contextlib.ExitStack, "_push_cm_exit", signalled)
    run = tmp_path / "run"
    with pytest.raises(Interrupted, match="SIGTERM during set-up") as info:
        Trainer(load_config(None, small_train_args(run))).fit()
    # while the traceback lives (a caller handling it), nothing but the garbage collector
    # could still release a lock whose release was never registered
    assert info.traceback and sorted(p.name for p in run.iterdir()) == []
