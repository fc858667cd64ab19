"""Owning a run directory: one run at a time in it, and never a silent start-over.

The run that owns a directory holds ``flock`` on ``<run>/.lock``, with its pid written in
it, for its whole life. The kernel frees a flock when its holder dies, however it dies, so
a killed run leaves no stale lock (the file may stay; the lock does not). ``legato train``
takes it in the process that launches the workers (or trains itself) and tells its workers
through ``OWNER_ENV`` that they need not; under torchrun or a cluster executor the
trainer's rank 0 takes it. A second run on the directory fails with one line naming the
holder's pid.

A directory that already holds a run (anything but the lock file) is resumed, never
started over by accident: from the checkpoint ``checkpoints/latest`` names or, when that
pointer is missing or names no checkpoint, from the newest checkpoint whose checksums
verify (said in one line). With nothing to resume, or with ``checkpoint.resume = 'none'``,
the run refuses in one line naming ``--run.fresh``, which deletes the old run's files
(once the lock is held, so never under a live run) and starts at step 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from legato.atomic import make_temp_dir
from legato.errors import ConfigError, LegatoError
from legato.parallel.process_group import DistContext
from legato.train.checkpoint import ResumePoint, checkpoint_at, latest_intact, read_meta
from legato.train.config import TrainConfig, make_run_dir

LOCK = ".lock"
OWNER_ENV = "LEGATO_RUN_DIR_OWNER"  # the run directory this process's launcher holds
_LOCK_TRIES = 10


@contextlib.contextmanager
def owned(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block; a no-op where this process or the one that
    launched it already holds it. A directory left with nothing but the lock file loses
    that too, so a run that wrote nothing leaves no trace, also when a stop signal lands
    while the lock is being taken (``Interrupted`` may be raised at any bytecode)."""
    key, before = str(run_dir.resolve()), os.environ.get(OWNER_ENV)
    if before == key:
        yield
        return
    fd: int | None = None
    try:
        fd = _lock(run_dir / LOCK)
        os.environ[OWNER_ENV] = key  # what launched workers inherit
        yield
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before
        if fd is not None:
            _release(fd, run_dir / LOCK)


def _lock(path: Path) -> int:
    """The open, locked lock file with this pid in it; a ConfigError naming the holder's
    pid when another process holds it. Whatever stops it midway releases what it took."""
    for _ in range(_LOCK_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise ConfigError(
                    f"run.dir: {path.parent} is in use by another run (pid {holder}); wait "
                    "for it to end or choose another run.dir"
                ) from None
            if _is_current(fd, path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
        except BaseException:
            _release(fd, path)
            raise
        os.close(fd)  # a holder leaving an empty directory removed this file: lock anew
    raise ConfigError(f"run.dir: could not lock {path}")


def _release(fd: int, path: Path) -> None:
    """Close the lock file ``fd``, first removing it when this process holds it, it is
    still the file at ``path`` and the directory holds nothing else."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op where already held
        if _is_current(fd, path) and not _contents(path.parent):
            path.unlink()
    except (BlockingIOError, FileNotFoundError):
        pass  # another run holds it, or the file or directory is gone
    finally:
        os.close(fd)


def _is_current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file at ``path`` (not one a leaving holder already removed)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _contents(run_dir: Path) -> list[str]:
    """What a run has left in ``run_dir``: every name but the lock file's, sorted."""
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK)


def _clear(run_dir: Path) -> None:
    """``run.fresh``: delete everything but the lock. The old files are first moved into
    one hidden folder, so what is left in view is never a mix of the old run's files."""
    trash = make_temp_dir(run_dir / "old-run")
    for name in _contents(run_dir):
        if name != trash.name:
            os.replace(run_dir / name, trash / name)
    shutil.rmtree(trash)


def start_point(run_dir: Path, config: TrainConfig) -> ResumePoint | None:
    """Where this invocation starts in ``run_dir``, whose lock is held: the checkpoint to
    resume, or None for step 0 (in an empty directory, or after ``run.fresh`` emptied it)."""
    if config.run.fresh:
        _clear(run_dir)
    resume = config.checkpoint.resume
    if resume not in ("auto", "none"):
        path = checkpoint_at(resume)
        return ResumePoint(path, read_meta(path))
    point = latest_intact(run_dir / "checkpoints") if resume == "auto" else None
    held = _contents(run_dir)
    if point is None and held:
        why = "no intact checkpoint to resume" if resume == "auto" else "checkpoint.resume = 'none'"
        raise ConfigError(
            f"run.dir: {run_dir} already holds a run ({', '.join(held)}) and {why}; pass "
            "--run.fresh to delete it and start over, or choose another run.dir"
        )
    return point


def claim_run_dir(
    ctx: DistContext, config: TrainConfig, held: contextlib.ExitStack
) -> tuple[Path, ResumePoint | None]:
    """Collective: rank 0 makes the run directory, owns it until ``held`` closes and finds
    where the run starts (``start_point``); every rank gets that or the same error."""
    outcome: Any = None
    if ctx.is_main:
        try:
            run_dir = make_run_dir(config.run)
            held.enter_context(owned(run_dir))
            outcome = (run_dir, start_point(run_dir, config))
        except LegatoError as exc:
            outcome = exc
    outcome = ctx.broadcast_object(outcome)
    if isinstance(outcome, LegatoError):
        raise outcome
    return outcome
