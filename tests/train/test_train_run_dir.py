"""A run directory has one owner (a flock the kernel frees when its holder dies, held by
the launching process for its workers) and is never started over without --run.fresh."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from legato.cli.main import main
from legato.errors import ConfigError
from legato.train.config import load_config
from legato.train.interrupt import Interrupted
from legato.train.run_dir import LOCK, owned
from legato.train.trainer import Trainer, TrainResult

WAIT_S = 120.0
HOLD = """\
import sys, time
from pathlib import Path
from legato.train.run_dir import owned
with owned(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(300)
"""


def _fit(args: list[str]) -> TrainResult:
    return Trainer(load_config(None, args)).fit()


def _in_use(run: Path, pid: int) -> str:
    return (
        f"run.dir: {run} is in use by another run (pid {pid}); wait for it to end or choose "
        "another run.dir"
    )


def test_a_held_run_dir_names_its_holder_and_a_killed_holder_frees_it(
    small_train_args, run_dir: Path
) -> None:
    run_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([holder.stdout], [], [], WAIT_S)
        assert ready and holder.stdout.readline().strip() == "held"
        args = small_train_args(run_dir, "--train.steps=2")
        with pytest.raises(ConfigError) as info:
            _fit(args)
        assert str(info.value) == _in_use(run_dir, holder.pid)
        holder.kill()  # SIGKILL: no clean-up runs, the kernel drops the lock
        holder.wait(timeout=WAIT_S)
        assert (run_dir / LOCK).is_file()  # the file stays, the lock does not
        assert _fit(args).steps == [1, 2]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize(
    ("module", "name"),
    [(fcntl, "flock"), (os.path, "samestat"), (os, "ftruncate"), (os, "pwrite")],
)
def test_a_signal_while_the_lock_is_taken_leaves_no_lock_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: object, name: str
) -> None:
    """A stop signal in set-up raises wherever it lands: also inside taking the lock."""
    real = getattr(module, name)

    def interrupted(*args: object) -> object:
        monkeypatch.setattr(module, name, real)  # one signal, then the call goes through
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(module, name, interrupted)
    with pytest.raises(Interrupted), owned(tmp_path):
        pass
    assert list(tmp_path.iterdir()) == []
    with owned(tmp_path):  # nothing half-taken still holds the lock
        assert (tmp_path / LOCK).read_text() == f"{os.getpid()}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_launcher_holds_the_lock_for_its_workers_for_the_whole_run(
    small_train_args, run_dir: Path
) -> None:
    """With 2 processes the launching process is the owner (its workers do not lock again),
    from before the workers start to after they end."""
    args = small_train_args(run_dir, "--train.steps=1000000", "--parallel.cluster=none")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "legato.cli.main", "train", *args, "--parallel.nproc=2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not (run_dir / "metrics.jsonl").is_file():  # rank 0 has claimed the directory
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.1)
        assert (run_dir / LOCK).read_text().strip() == str(launcher.pid)
        with pytest.raises(ConfigError) as info:
            _fit(small_train_args(run_dir, "--parallel.nproc=1"))
        assert str(info.value) == _in_use(run_dir, launcher.pid)
        launcher.send_signal(signal.SIGTERM)  # the workers stop after the step under way
        assert launcher.wait(timeout=WAIT_S) == 130, launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_run_dir_that_holds_a_run_is_not_started_over_without_run_fresh(
    small_train_args, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _fit(small_train_args(run_dir, "--train.steps=2"))  # checkpoint.every = 0
    metrics = (run_dir / "metrics.jsonl").read_text()
    for extra in ([], ["--checkpoint.resume=none"]):
        with pytest.raises(ConfigError) as info:
            _fit(small_train_args(run_dir, "--train.steps=3", *extra))
        message = str(info.value)
        assert message.startswith(f"run.dir: {run_dir} already holds a run (config.toml, ")
        assert "pass --run.fresh to delete it and start over" in message and "\n" not in message
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # nothing was touched
    capsys.readouterr()
    args = small_train_args(run_dir, "--train.steps=2", "--parallel.nproc=1")
    assert main(["train", *args, "--run.fresh"]) == 0  # the flag may stand alone
    [invocation] = [json.loads(line) for line in (run_dir / "invocations.jsonl").open()]
    assert invocation["start_step"] == 0 and invocation["config"]["run"]["fresh"] is False
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()]
    assert losses == first.losses  # the same two steps again, not four records
