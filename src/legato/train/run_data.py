"""A run's tokenizer and token streams, the same for ``legato train``, ``eval`` and ``export``.

The trainer saves its tokenizer as ``<run>/tokenizer.json`` (a trained BPE exactly as
trained; for the byte tokenizer an equivalent ``tokenizers`` file), so what reads a run
later does not depend on the cache still holding it. The held-out split is the tail
``data.holdout`` of the token stream (``data.split_tokens``): the training windows are
cut from the rest only, so no validation token is ever trained on, and the training
dataset's fingerprint covers exactly the tokens it serves (a resume with another
``data.holdout`` is refused as another dataset).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from legato.data import (
    ByteTokenizer,
    PackedDataset,
    Tokenizer,
    builtin_corpus_path,
    load_tokenizer,
    prepare_tokens,
    split_tokens,
)
from legato.data.tokenizer import TOKENIZER_FILE
from legato.errors import ConfigError, DataError
from legato.train.config import DataSection


def _cache(data: DataSection) -> Path:
    return Path(data.cache_dir).expanduser()


def corpus_paths(data: DataSection) -> list[str]:
    """``data.paths``, or the built-in corpus (fetched into the cache) when empty."""
    return data.paths or [str(builtin_corpus_path(_cache(data)))]


def resolve_tokenizer(data: DataSection) -> Tokenizer:
    """``data.tokenizer`` as the trainer resolves it ('bpe' trains once, then is cached)."""
    return load_tokenizer(
        data.tokenizer,
        train_files=corpus_paths(data),
        vocab_size=data.bpe_vocab_size,
        cache_dir=_cache(data),
        text_field=data.text_field,
    )


def save_run_tokenizer(tokenizer: Tokenizer, run_dir: Path) -> Path:
    """Write ``<run>/tokenizer.json`` atomically (rank 0 only)."""
    return tokenizer.save(run_dir / TOKENIZER_FILE)


def run_tokenizer(run_dir: Path | None, data: DataSection) -> Tokenizer:
    """The tokenizer a run trained with: its saved file, else ``data.tokenizer`` again
    (runs from before the file was saved)."""
    if data.tokenizer == "byte":
        return ByteTokenizer()
    saved = run_dir / TOKENIZER_FILE if run_dir is not None else None
    if saved is not None and saved.is_file():
        return load_tokenizer(run_dir)  # a model folder's tokenizer saved its config beside it
    return resolve_tokenizer(data)


def token_stream(
    data: DataSection, tokenizer: Tokenizer, paths: list[str] | None = None
) -> np.ndarray:
    """The tokens of ``paths`` (default: the run's corpus), cached like the trainer's."""
    return prepare_tokens(
        paths or corpus_paths(data), tokenizer, text_field=data.text_field, cache_dir=_cache(data)
    )


def split_holdout(tokens: np.ndarray, holdout: float) -> tuple[np.ndarray, np.ndarray | None]:
    """(training tokens, held-out tokens or None when ``data.holdout`` is 0)."""
    if holdout == 0:
        return tokens, None
    return split_tokens(tokens, holdout)


def eval_dataset(tokens: np.ndarray, seq_len: int, where: str) -> PackedDataset:
    """Every window of ``tokens`` in order (no shuffle): the fixed evaluation set."""
    if len(tokens) < seq_len + 1:
        raise DataError(
            f"{where}: {len(tokens)} tokens are fewer than one sequence of seq_len + 1 = "
            f"{seq_len + 1}; use more data"
        )
    return PackedDataset(tokens, seq_len, seed=0, shuffle=False)


def check_vocab(tokenizer: Tokenizer, vocab_size: int, data: DataSection) -> None:
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError(
            f"model.overrides.vocab_size: the model's vocabulary ({vocab_size}) is smaller "
            f"than the tokenizer's ({tokenizer.vocab_size}, data.tokenizer = "
            f"{data.tokenizer!r}); it must be >= {tokenizer.vocab_size}"
        )
