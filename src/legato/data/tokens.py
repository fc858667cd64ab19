"""Tokenise a corpus once into one flat array of ids, cached on disk as ``.npy``.

Every document is encoded and followed by the tokenizer's end-of-text id; the documents
are concatenated in file order. The result is cached in ``cache_dir`` under a key made of
the files (resolved paths, sizes, mtimes), the tokenizer's ``name`` (which identifies its
vocabulary) and the text field, so a second run memory-maps the cache instead of
re-tokenising, and editing a file or switching tokenizer invalidates it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from legato.atomic import write_atomic
from legato.data._files import fingerprint
from legato.data.sources import read_file, resolve_paths
from legato.data.tokenizer import Tokenizer
from legato.errors import DataError

# progress(bytes_done, bytes_total); bytes are of the input files, so it ends at the total.
ProgressFn = Callable[[int, int], None]

_CACHE_VERSION = 1
_BATCH_DOCS = 256
_PROGRESS_MIN_BYTES = 16 << 20  # a bar for inputs that take more than a moment


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def prepare_tokens(
    paths: str | Path | Sequence[str | Path],
    tokenizer: Tokenizer,
    *,
    text_field: str = "text",
    cache_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """Return the token stream of ``paths`` (uint16, or uint32 for vocabularies over 65,536).

    With ``cache_dir`` the stream is stored as ``tokens-<key>.npy`` (atomically) and later
    calls return it memory-mapped read-only. ``progress`` is called as documents are
    encoded; without one a rich progress bar is shown for large inputs on a terminal.
    """
    files = resolve_paths(paths)
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = fingerprint(_CACHE_VERSION, stats, tokenizer.name, tokenizer.vocab_size, text_field)
    cache_path = Path(cache_dir) / f"tokens-{key}.npy" if cache_dir is not None else None
    if cache_path is not None and cache_path.is_file():
        try:
            return np.load(cache_path, mmap_mode="r")
        except (OSError, ValueError):
            pass  # a damaged cache is rebuilt below
    total = sum(size for _, size, _ in stats)
    if progress is None and _show_bar(total):
        tokens = _with_rich_bar(files, tokenizer, text_field, total)
    else:
        tokens = _tokenize(files, tokenizer, text_field, progress, total)
    if tokens.size == 0:
        raise DataError(f"data.paths: no documents found in {', '.join(map(str, files))}")
    if cache_path is not None:
        write_atomic(cache_path, lambda tmp: np.save(tmp, tokens, allow_pickle=False))
    return tokens


def _tokenize(
    files: list[Path], tokenizer: Tokenizer, field: str, progress: ProgressFn | None, total: int
) -> np.ndarray:
    dtype = token_dtype(tokenizer.vocab_size)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    encode_batch = getattr(tokenizer, "encode_batch", None)
    chunks: list[np.ndarray] = []
    done = 0
    for path, size in ((p, p.stat().st_size) for p in files):
        seen = 0
        for batch in _batched(read_file(path, text_field=field)):
            encoded = encode_batch(batch) if encode_batch else [tokenizer.encode(t) for t in batch]
            for ids in encoded:
                chunks.append(np.asarray(ids, dtype=dtype))
                chunks.append(eos)
            if progress is not None:
                seen = min(size, seen + sum(len(t) for t in batch))
                progress(done + seen, total)
        done += size
        if progress is not None:
            progress(done, total)
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)


def _batched(docs: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == _BATCH_DOCS:
            yield batch
            batch = []
    if batch:
        yield batch


def _show_bar(total: int) -> bool:
    quiet = "PYTEST_CURRENT_TEST" in os.environ or not sys.stderr.isatty()
    return total >= _PROGRESS_MIN_BYTES and not quiet


def _with_rich_bar(files: list[Path], tokenizer: Tokenizer, field: str, total: int) -> np.ndarray:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = ("tokenising", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("tokenise", total=total)
        return _tokenize(
            files, tokenizer, field, lambda done, _: bar.update(task, completed=done), total
        )
