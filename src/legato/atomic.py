"""Atomic file writes, shared by every layer that writes files.

Caches, tokenizers, checkpoints, safetensors, plots and cluster files are all written to a
unique temp file in the destination folder, flushed to disk and renamed over the target.
A reader (another rank, a resumed run) therefore sees either the old file or the whole new
one, and a crash mid-write leaves nothing half-written under the final name.

The temp files and folders are created with the modes a plain ``open``/``mkdir`` gives
(0666/0777 less the umask), not ``tempfile``'s 0600/0700: the rename keeps the mode, and a
run or an exported model must be as shareable as anything else the user writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

_TRIES = 100


def _beside(path: Path, create: Callable[[Path], object]) -> Path:
    """``create`` a new hidden entry beside ``path`` under a random name; its path."""
    for _ in range(_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            create(tmp)
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"{path.parent}: no free temp name for {path.name}")


def _new_file(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def make_temp_dir(path: str | Path) -> Path:
    """A new empty folder beside ``path``, to fill and then rename onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _beside(path, lambda tmp: tmp.mkdir(0o777))


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` with a temp path beside ``path`` (same suffix, so tools that
    infer the format from it still work), fsync it and rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _beside(path, _new_file)
    try:
        mode = stat.S_IMODE(tmp.stat().st_mode)  # what the umask gives a new file
        write(tmp)
        tmp.chmod(mode)  # a writer may have replaced it by its own 0600 file (safetensors)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
