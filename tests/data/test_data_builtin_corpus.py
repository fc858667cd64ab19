"""The built-in corpus: deterministic, the promised size, fast, written once, well formed."""

from __future__ import annotations

import time

from legato.data import ByteTokenizer, builtin_corpus_path, prepare_tokens, read_documents
from legato.data.builtin_corpus import DEFAULT_BYTES, generate_documents


def test_deterministic_per_seed():
    a = generate_documents(seed=0, target_bytes=200_000)
    assert a == generate_documents(seed=0, target_bytes=200_000)
    assert a != generate_documents(seed=1, target_bytes=200_000)


def test_default_file_size_speed_and_write_once(tmp_path):
    start = time.perf_counter()
    path = builtin_corpus_path(tmp_path)
    assert time.perf_counter() - start < 10
    size = path.stat().st_size
    assert 2_000_000 <= DEFAULT_BYTES <= size <= 5_000_000
    mtime = path.stat().st_mtime_ns
    assert builtin_corpus_path(tmp_path) == path and path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left
    assert builtin_corpus_path(tmp_path, seed=1) != path


def test_documents_survive_the_txt_round_trip(tmp_path):
    docs = generate_documents(seed=2, target_bytes=100_000)
    path = builtin_corpus_path(tmp_path, seed=2, target_bytes=100_000)
    assert list(read_documents(path)) == docs
    assert len(docs) > 200 and len(set(docs)) > 0.9 * len(docs)  # varied, not one template
    tokens = prepare_tokens(path, ByteTokenizer())
    assert tokens.max() == 256 and (tokens == 256).sum() == len(docs)  # ASCII text plus eos


def test_world_facts_are_consistent():
    """A person lives in one town everywhere, so the facts are learnable, not noise."""
    towns: dict[str, set[str]] = {}
    for doc in generate_documents(seed=0, target_bytes=300_000):
        for sentence in doc.replace("\n", " ").split(". "):
            words = sentence.split()
            if len(words) == 4 and words[1:3] == ["lives", "in"]:
                towns.setdefault(words[0], set()).add(words[3].rstrip("."))
    assert len(towns) > 20 and all(len(t) == 1 for t in towns.values())
