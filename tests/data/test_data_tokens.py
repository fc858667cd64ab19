"""Token preparation: eos after each document, dtype by vocabulary, the on-disk cache."""

from __future__ import annotations

import os

import numpy as np
import pytest

from legato.data import ByteTokenizer, prepare_tokens, token_dtype
from legato.errors import DataError


class CountingTokenizer(ByteTokenizer):
    """A byte tokenizer that counts encode calls (no encode_batch, the generic path)."""

    encode_batch = None

    def __init__(self, name: str = "counting", vocab_size: int = 258) -> None:
        self.name = name
        self.vocab_size = vocab_size
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return super().encode(text)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("ab\n\nc\n\nGrüß", encoding="utf-8")
    return path


def test_every_document_then_eos(corpus):
    tokens = prepare_tokens(corpus, ByteTokenizer())
    expected = [97, 98, 256, 99, 256, *"Grüß".encode(), 256]
    assert tokens.dtype == np.uint16 and tokens.tolist() == expected


def test_dtype_follows_vocabulary(corpus):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    big = CountingTokenizer("big", vocab_size=100_000)
    big.eos_id = 99_999
    tokens = prepare_tokens(corpus, big)
    assert tokens.dtype == np.uint32 and tokens[2] == 99_999


def test_cache_hit_skips_tokenising(corpus, tmp_path):
    cache = tmp_path / "cache"
    tok = CountingTokenizer()
    first = prepare_tokens(corpus, tok, cache_dir=cache)
    assert tok.calls == 3
    assert len(list(cache.glob("tokens-*.npy"))) == 1
    assert not list(cache.glob(".*"))  # no temp file left behind
    second = prepare_tokens(corpus, tok, cache_dir=cache)
    assert tok.calls == 3 and np.array_equal(first, second)
    assert isinstance(second, np.memmap) and not second.flags.writeable


def test_cache_key_tracks_files_tokenizer_and_field(corpus, tmp_path):
    cache = tmp_path / "cache"
    tok = CountingTokenizer()
    prepare_tokens(corpus, tok, cache_dir=cache)
    prepare_tokens(corpus, CountingTokenizer("other"), cache_dir=cache)
    prepare_tokens(corpus, tok, cache_dir=cache, text_field="body")
    assert len(list(cache.glob("tokens-*.npy"))) == 3
    corpus.write_text("changed text", encoding="utf-8")
    os.utime(corpus, ns=(1, 1))
    tokens = prepare_tokens(corpus, tok, cache_dir=cache)
    assert tokens.tolist() == [*b"changed text", 256]


def test_damaged_cache_is_rebuilt(corpus, tmp_path):
    tok = CountingTokenizer()
    good = prepare_tokens(corpus, tok, cache_dir=tmp_path / "cache")
    (cached,) = (tmp_path / "cache").glob("tokens-*.npy")
    cached.write_bytes(b"garbage")
    assert np.array_equal(prepare_tokens(corpus, tok, cache_dir=tmp_path / "cache"), good)
    assert tok.calls == 6


def test_progress_reaches_total(corpus):
    seen = []
    prepare_tokens(corpus, ByteTokenizer(), progress=lambda done, total: seen.append((done, total)))
    size = corpus.stat().st_size
    assert seen and seen[-1] == (size, size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_no_documents(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"no documents found in .*empty\.txt"):
        prepare_tokens(empty, ByteTokenizer())
