"""Start N local worker processes of a command and wait for them: ``legato train``,
``finetune`` and ``calibrate`` with more than one process on this host.

Our own launcher, not torch's elastic one (what torchrun runs), because of how a run
ends. On Ctrl-C the elastic agent kills its workers at once, logs a 25-line traceback and
re-raises in the parent, so a worker never gets to stop at a step boundary and save.
Here the workers own the stop: a terminal's Ctrl-C reaches the whole foreground process
group, so they already have SIGINT; a SIGTERM (sent to this parent only, e.g. by a job
scheduler) is forwarded to each of them once. Either way the launcher only waits for
them (``GRACE_S``, then SIGKILL, said in one line) and exits 130 without a word of its
own: the workers' rank 0 says what happened.

Each worker gets what torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and joins with ``env://``. The
rendezvous store lives in this parent, as under torchrun's agent
(``TORCHELASTIC_USE_AGENT_STORE``): it holds the port from the start, so no free port
is guessed and raced for. A user error in a worker (``LegatoError``) is left in a
shared folder by ``report_errors`` and raised here once per distinct message, as one
line, instead of one traceback per rank.

A worker dies with the process that launched it (``die_with_launcher``, called when it
joins the group): a SIGKILLed launcher or torchrun agent leaves no worker training on,
orphaned, into a run directory that the next run may already own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from legato.errors import LegatoError

ERROR_DIR_ENV = "LEGATO_ERROR_DIR"  # where launched workers leave their one-line errors
LAUNCHER_PID_ENV = "LEGATO_LAUNCHER_PID"  # the launcher a worker must not outlive
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent for its workers
_PR_SET_PDEATHSIG = 1  # prctl(2)
GRACE_S = 60.0  # how long stopping workers may take (a checkpoint) before they are killed
FAILURE_GRACE_S = 10.0  # after one worker failed, how long the others get to exit
INTERRUPTED = 130  # exit code of a run stopped by SIGINT or SIGTERM (128 + SIGINT)
_POLL_S = 0.05
# How a worker may end after an interrupt without a word: done, stopped as agreed (130),
# ended by the signal itself, or killed after its grace (already said).
_STOPPED = (0, INTERRUPTED, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL)


class WorkerError(LegatoError):
    """The distinct one-line errors of the workers, shown once each."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("\n".join(dict.fromkeys(messages)))


def report_errors(body: Callable[[], int]) -> int:
    """Run a launched worker's ``body``; a ``LegatoError`` is written to the launcher's
    error folder (the launcher prints it once) and the worker exits 2. Outside a launch
    the error propagates as usual."""
    error_dir = os.environ.get(ERROR_DIR_ENV)
    try:
        return body()
    except LegatoError as exc:
        if not error_dir:
            raise
        rank = os.environ.get("RANK", "0")
        Path(error_dir, f"rank{rank}.txt").write_text(str(exc), encoding="utf-8")
        return 2


def die_with_launcher() -> None:
    """In a worker of legato's launcher or of torchrun's agent, ask the kernel for SIGKILL
    when that parent dies (``PR_SET_PDEATHSIG``; Linux only, a no-op elsewhere and outside
    a launch). A launcher that is already gone (the worker was re-parented before it got
    here) ends the worker at once."""
    expected = os.environ.get(LAUNCHER_PID_ENV)
    if expected is None and TORCHRUN_ENV not in os.environ:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected is not None and os.getppid() != int(expected):
        os._exit(INTERRUPTED)


class _Stop:
    """What the parent was told: nothing, SIGINT (the workers have it too) or SIGTERM
    (forwarded to the workers once)."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.since: float | None = None
        self.forwarded = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.since is None:
            self.since = time.monotonic()
        if signum == signal.SIGTERM and not self.forwarded:
            self.forwarded = True
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)


@contextlib.contextmanager
def _handled(stop: _Stop) -> Iterator[None]:
    """``stop`` handles SIGINT and SIGTERM while the block runs (main thread only: Python
    delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _worker_env(rank: int, nproc: int, port: int, error_dir: str) -> dict[str, str]:
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        ERROR_DIR_ENV: error_dir,
        LAUNCHER_PID_ENV: str(os.getpid()),
    }


def _kill(procs: list[subprocess.Popen]) -> bool:
    """SIGKILL those still running; whether there were any."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.kill()
    for p in alive:
        p.wait()
    return bool(alive)


def _wait(procs: list[subprocess.Popen], stop: _Stop, grace_s: float) -> list[int]:
    """Every worker's exit code. A failed worker's peers get SIGTERM and
    ``FAILURE_GRACE_S`` (they would wait for it in a collective forever); an interrupted
    run's workers get ``grace_s``. Whoever outlives its grace is killed."""
    failed_at: float | None = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if stop.since is not None and now - stop.since > grace_s:
            if _kill(procs):
                print(
                    f"legato: workers did not stop within {grace_s:.0f} s; killed them",
                    file=sys.stderr,
                    flush=True,
                )
            break
        if stop.since is None and failed_at is None and any(p.poll() for p in procs):
            failed_at = now
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        if failed_at is not None and now - failed_at > FAILURE_GRACE_S:
            _kill(procs)
            break
        time.sleep(_POLL_S)
    return [p.wait() for p in procs]


def _first_failure(codes: list[int]) -> int:
    """The exit code to report: the first worker's that failed on its own (not one we
    stopped by SIGTERM or SIGKILL after it)."""
    own = [c for c in codes if c not in (0, -signal.SIGTERM, -signal.SIGKILL)]
    return (own or [c for c in codes if c] or [1])[0]


def launch(nproc: int, argv: Sequence[str], grace_s: float = GRACE_S) -> int:
    """Run ``python argv`` as ``nproc`` ranks on this host; 0 when every rank succeeded,
    ``INTERRUPTED`` after SIGINT or SIGTERM, else the first failed rank's exit code
    (``WorkerError`` when workers reported user errors)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="legato-errors-") as errors:
        procs: list[subprocess.Popen] = []
        stop = _Stop(procs)
        with _handled(stop):
            try:
                for rank in range(nproc):
                    if stop.since is not None:  # interrupted while starting: start no more
                        break
                    env = _worker_env(rank, nproc, store.port, errors)
                    procs.append(subprocess.Popen([sys.executable, *argv], env=env))
            except BaseException:
                _kill(procs)
                raise
            codes = _wait(procs, stop, grace_s)
        messages = [p.read_text(encoding="utf-8") for p in sorted(Path(errors).glob("rank*.txt"))]
    del store
    if stop.since is not None:
        odd = [c for c in codes if c not in _STOPPED]
        if odd:
            print(f"legato: a worker exited with code {odd[0]} while stopping", file=sys.stderr)
        return INTERRUPTED
    if messages:
        raise WorkerError(messages)
    if any(codes):
        code = _first_failure(codes)
        print(f"legato: error: a worker process failed (exit code {code})", file=sys.stderr)
        return code if code > 0 else 1
    return 0
