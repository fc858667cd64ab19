"""``legato.parallel.launch`` with two real gloo workers: an interrupt lets the workers stop
on their own and the parent exits 130 without a traceback; a hung worker is killed after
the grace period with one line; a user error in the workers is one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from session_guard import exited

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("launch_worker.py")


def _start(tmp_path: Path, mode: str, grace_s: float = 60.0) -> subprocess.Popen[str]:
    """The launcher, in a session of its own; its temporary files go to ``tmp_path`` (a
    SIGKILLed one cannot remove its error folder)."""
    command = [sys.executable, str(WORKER), "parent", str(grace_s), mode, str(tmp_path)]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path, env=env
    )


def _when_ready(proc: subprocess.Popen[str], tmp_path: Path) -> None:
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the workers never joined"
        time.sleep(0.05)


def test_sigterm_is_forwarded_and_the_workers_stop_on_their_own(tmp_path: Path) -> None:
    proc = _start(tmp_path, "run")
    _when_ready(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)  # to the parent only, as a job scheduler sends it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [(tmp_path / f"stopped{r}").read_text() for r in (0, 1)] == ["SIGTERM"] * 2
    assert "Traceback" not in err and "legato" not in err


def test_ctrl_c_reaches_the_workers_and_the_parent_stays_quiet(tmp_path: Path) -> None:
    proc = _start(tmp_path, "run")
    _when_ready(proc, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [(tmp_path / f"stopped{r}").read_text() for r in (0, 1)] == ["SIGINT"] * 2
    assert "Traceback" not in err and "legato" not in err


def test_a_stuck_worker_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    proc = _start(tmp_path, "hang", grace_s=1.0)
    _when_ready(proc, tmp_path)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert time.monotonic() - began < 30
    assert err.strip().splitlines() == ["legato: workers did not stop within 1 s; killed them"]
    assert not (tmp_path / "stopped0").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["legato", "torchrun"])
def test_workers_die_with_a_sigkilled_launcher(tmp_path: Path, launcher: str) -> None:
    """SIGKILL of the launcher alone (legato's, or torchrun's agent; no handler runs) still
    ends its workers: none trains on, orphaned, into a run directory a new run may take."""
    if launcher == "legato":
        proc = _start(tmp_path, "run")
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(WORKER), "worker", "run", str(tmp_path)]  # fmt: skip
        env = {**os.environ, "TMPDIR": str(tmp_path)}  # where the agent's logs go
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=tmp_path, env=env)  # fmt: skip
    try:
        _when_ready(proc, tmp_path)
        workers = [int((tmp_path / f"ready{r}").read_text()) for r in (0, 1)]
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 30
        while not all(exited(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(exited(pid) for pid in workers), f"workers outlived {launcher}'s launcher"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_user_error_in_the_workers_is_one_line(tmp_path: Path) -> None:
    proc = _start(tmp_path, "error")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.strip().splitlines() == ["legato: error: train.steps: must be >= 1, got 0"]
