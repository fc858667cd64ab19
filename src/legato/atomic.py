"""Atomic file writes, shared by every layer that writes files.

Caches, tokenizers, checkpoints, safetensors, plots and cluster files are all written to a
unique temp file in the destination folder, flushed to disk and renamed over the target.
A reader (another rank, a resumed run) therefore sees either the old file or the whole new
one, and a crash mid-write leaves nothing half-written under the final name.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` with a temp path beside ``path`` (same suffix, so tools that
    infer the format from it still work), fsync it and rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}"
    )
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
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
