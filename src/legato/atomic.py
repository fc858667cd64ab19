"""Atomic file writes, shared by every layer that writes files.

Caches, tokenizers, checkpoints, safetensors, plots and cluster files are all written to a
unique temp file in the destination folder, flushed to disk and renamed over the target.
A reader (another rank, a resumed run) therefore sees either the old file or the whole new
one, and a crash mid-write leaves nothing half-written under the final name.

The temp files and folders are created with the modes a plain ``open``/``mkdir`` gives
(0666/0777 less the umask), not ``tempfile``'s 0600/0700: the rename keeps the mode, and a
run or an exported model must be as shareable as anything else the user writes.

Where the destination cannot be made (a file where a folder must be, no permission), the
error is a ``WriteError`` naming the path and what is in the way; a caller that knows the
flag or config field that chose the path names it too (``naming``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from legato.errors import WriteError

_TRIES = 100


@contextlib.contextmanager
def naming(field: str) -> Iterator[None]:
    """Prefix a ``WriteError`` raised inside with ``field``, the flag or config field that
    chose the path (``--config: cannot write ...``)."""
    try:
        yield
    except WriteError as exc:
        raise WriteError(f"{field}: {exc}") from None


def _mkdir(folder: Path, target: Path) -> None:
    """``mkdir -p folder``, made for ``target`` (the folder itself, or a file to go in it);
    a ``WriteError`` naming ``target`` and the file in the way, else the OS's reason."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        scan = (folder, *folder.parents)
        blocker = next((p for p in scan if p.exists() and not p.is_dir()), None)
        reason = exc.strerror or str(exc)
        if blocker is not None:
            reason = "it is a file" if blocker == target else f"{blocker} is a file"
        verb = "create the folder" if folder == target else "write"
        raise WriteError(f"cannot {verb} {target}: {reason}") from None


def make_dirs(path: str | Path) -> Path:
    """The folder ``path``, created with its parents if missing; a ``WriteError`` where it
    cannot be (it or a parent is a file, no permission)."""
    path = Path(path)
    _mkdir(path, path)
    return path


def _beside(path: Path, create: Callable[[Path], object]) -> Path:
    """``create`` a new hidden entry beside ``path`` under a random name, ``path``'s folder
    made first; its path."""
    _mkdir(path.parent, path)
    for _ in range(_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            create(tmp)
        except FileExistsError:
            continue
        except OSError as exc:  # the folder is not writable
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        return tmp
    raise WriteError(f"cannot write {path}: no free temp name in {path.parent}")


def _new_file(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def make_temp_dir(path: str | Path) -> Path:
    """A new empty folder beside ``path``, to fill and then rename onto it."""
    return _beside(Path(path), lambda tmp: tmp.mkdir(0o777))


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` with a temp path beside ``path`` (same suffix, so tools that
    infer the format from it still work), fsync it and rename it onto ``path``."""
    path = Path(path)
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
