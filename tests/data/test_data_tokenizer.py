"""Tokenizers: byte round trip, BPE train/save/load, load_tokenizer specs and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from legato.data import BpeTokenizer, ByteTokenizer, Tokenizer, load_tokenizer, train_bpe
from legato.errors import DataError

TEXT = "Grüße aus Köln! 東京 🚀 — naïve café\nsecond line"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bpe") / "corpus.txt"
    docs = [f"the {c} cat sat on the {m} mat number {i}" for i in range(300)
            for c, m in [("red", "blue"), ("big", "small")]]  # fmt: skip
    path.write_text("\n\n".join([*docs, TEXT]), encoding="utf-8")
    return path


def test_byte_round_trip_non_ascii():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert max(ids) < 256 and tok.decode(ids) == TEXT
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (258, 256, 257)
    assert tok.decode([*ids[:4], tok.eos_id, tok.pad_id]) == "Grü"  # specials are dropped
    assert tok.decode(ids[:3]) == "Gr\ufffd"  # cut inside "ü"
    assert isinstance(tok, Tokenizer)


def test_bpe_train_save_load_round_trip(corpus, tmp_path):
    out = tmp_path / "tok" / "tokenizer.json"
    tok = train_bpe([corpus], 400, out)
    assert out.is_file() and not list(out.parent.glob(".*tmp"))
    assert 257 <= tok.vocab_size <= 400
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert len(tok.encode("the red cat sat on the blue mat")) < len(
        "the red cat sat on the blue mat"
    )
    reloaded = BpeTokenizer.load(out)
    assert reloaded.encode(TEXT) == ids
    assert (reloaded.name, reloaded.eos_id, reloaded.vocab_size) == (
        tok.name,
        tok.eos_id,
        tok.vocab_size,
    )
    assert tok.pad_id == tok.eos_id == reloaded._tok.token_to_id("<|endoftext|>")
    assert isinstance(tok, Tokenizer)


def test_bpe_training_is_deterministic(corpus, tmp_path):
    """Every rank may train the tokenizer itself, so all must get the same one."""
    a = train_bpe(corpus, 400, tmp_path / "a.json")
    b = train_bpe(corpus, 400, tmp_path / "b.json")
    assert a.name == b.name
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()


def test_load_tokenizer_specs(corpus, tmp_path):
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    first = load_tokenizer("bpe", train_files=[corpus], vocab_size=400, cache_dir=tmp_path)
    (cached,) = tmp_path.glob("tokenizer-*.json")
    mtime = cached.stat().st_mtime_ns
    again = load_tokenizer("bpe", train_files=[corpus], vocab_size=400, cache_dir=tmp_path)
    assert again.name == first.name and cached.stat().st_mtime_ns == mtime  # loaded, not retrained
    other = load_tokenizer("bpe", train_files=[corpus], vocab_size=300, cache_dir=tmp_path)
    assert other.name != first.name and len(list(tmp_path.glob("tokenizer-*.json"))) == 2
    assert load_tokenizer(str(cached)).name == first.name
    (tmp_path / "dir").mkdir()
    first.save(tmp_path / "dir" / "tokenizer.json")
    assert load_tokenizer(tmp_path / "dir").name == first.name


def test_load_tokenizer_errors(corpus, tmp_path):
    with pytest.raises(DataError, match=r"'byte', 'bpe' or a path.*not found: .*nope"):
        load_tokenizer("nope")
    with pytest.raises(DataError, match="vocab_size"):
        load_tokenizer("bpe", train_files=[corpus])
    with pytest.raises(DataError, match=r"data\.paths"):
        load_tokenizer("bpe", vocab_size=400)
    with pytest.raises(DataError, match="at least 257"):
        train_bpe(corpus, 100, tmp_path / "t.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": ', encoding="utf-8")
    with pytest.raises(DataError, match=r"tokenizer.json is not a valid tokenizer.json") as err:
        load_tokenizer(str(bad))
    assert "\n" not in str(err.value)
    good = train_bpe(corpus, 300, tmp_path / "good.json")
    no_eos = (tmp_path / "good.json").read_text().replace("<|endoftext|>", "<|other|>")
    (tmp_path / "noeos.json").write_text(no_eos, encoding="utf-8")
    with pytest.raises(DataError, match="no end-of-text token"):
        BpeTokenizer.load(tmp_path / "noeos.json")
    assert good.vocab_size > 257
