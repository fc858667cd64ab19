"""Small file helpers shared by the data modules: atomic writes and content fingerprints.

Several ranks of one job may build the same cache file at the same moment, and a run may be
killed mid-write; writing to a unique temp file in the target folder and renaming it over
the destination means a reader only ever sees a complete file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file next to ``path``; on success rename it over ``path``, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | Path, write: Callable[[IO[Any]], None], mode: str = "wb") -> Path:
    """Call ``write(handle)`` on a temp file and rename it to ``path`` when it returns."""
    with atomic_file(path, mode) as handle:
        write(handle)
    return Path(path)


def fingerprint(*parts: Any) -> str:
    """A short stable hex digest of JSON-able ``parts`` (used as cache keys)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.blake2b(blob, digest_size=8).hexdigest()
