"""Read training documents from ``.txt``, ``.jsonl`` and ``.parquet`` files, folders and globs.

Document boundaries matter because each document is followed by end-of-text when it is
tokenised. The rules per format:

- ``.txt``: a file is split on runs of blank (whitespace-only) lines; each run of non-blank
  lines is one document, its lines joined by ``\\n`` (leading/trailing blank lines dropped).
- ``.jsonl``: one JSON object per line, the document is its ``text_field`` (default
  ``"text"``); blank lines are skipped, a null value is skipped, anything else that is not
  a string is a DataError with ``file:line``.
- ``.parquet``: the string column ``text_field``; nulls are skipped.

A folder is read recursively (files with the suffixes above, sorted by path); a string with
``*``, ``?`` or ``[`` is a glob pattern (``**`` recurses). Files are read in the order given,
each folder and glob sorted, so the token stream is reproducible.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from legato.errors import DataError

SUFFIXES = (".txt", ".jsonl", ".parquet")
_GLOB_CHARS = set("*?[")


def resolve_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """Expand files, folders and glob patterns into the ordered list of data files."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not items:
        raise DataError("data.paths: no files given")
    files: list[Path] = []
    for item in items:
        text = str(item)
        if _GLOB_CHARS & set(text):
            matches = sorted(Path(m) for m in glob.glob(text, recursive=True))
            matches = [m for m in matches if m.is_file() and m.suffix in SUFFIXES]
            if not matches:
                raise DataError(f"data.paths: no {'/'.join(SUFFIXES)} files match {text}")
            files.extend(matches)
            continue
        path = Path(text).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not found:
                raise DataError(f"data.paths: no {'/'.join(SUFFIXES)} files in folder {path}")
            files.extend(found)
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise DataError(
                    f"data.paths: {path} has unsupported type {path.suffix or '(none)'!r}; "
                    f"allowed: {', '.join(SUFFIXES)}"
                )
            files.append(path)
        else:
            raise DataError(f"data.paths: file not found: {path}")
    return files


def read_documents(
    paths: str | Path | Sequence[str | Path], *, text_field: str = "text"
) -> Iterator[str]:
    """Yield the documents of every file in ``paths`` in order (see the module docstring)."""
    for path in resolve_paths(paths):
        yield from read_file(path, text_field=text_field)


def read_file(path: Path, *, text_field: str = "text") -> Iterator[str]:
    """Yield the documents of one ``.txt``, ``.jsonl`` or ``.parquet`` file."""
    reader = {".txt": _read_txt, ".jsonl": _read_jsonl, ".parquet": _read_parquet}[path.suffix]
    return reader(path, text_field)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("r", encoding="utf-8", newline=None) as handle:
        lineno = 0
        try:
            for lineno, line in enumerate(handle, start=1):
                yield lineno, line
        except UnicodeDecodeError:
            # text is decoded in blocks, so only the last complete line is known
            raise DataError(f"{path}: not valid UTF-8 text (after line {lineno})") from None


def _read_txt(path: Path, _field: str) -> Iterator[str]:
    block: list[str] = []
    for _, line in _lines(path):
        if line.strip():
            block.append(line.rstrip("\n"))
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed record)`` of each non-blank line; bad JSON or bad UTF-8 is a
    DataError naming ``file:line``."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
    for lineno, record in iter_jsonl(path):
        if not isinstance(record, dict) or field not in record:
            raise DataError(f"{path}:{lineno}: no field {field!r} (set data.text_field)")
        value = record[field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise DataError(
                f"{path}:{lineno}: field {field!r} must be a string, got {type(value).__name__}"
            )
        yield value


def _read_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise DataError(
            f"{path}: no column {field!r} (set data.text_field); columns: {', '.join(columns)}"
        )
    kind = parquet.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: column {field!r} must hold strings, it holds {kind}")
    for batch in parquet.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value
