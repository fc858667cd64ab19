"""Tokenizers: raw UTF-8 bytes, or a byte-level BPE trained locally with Hugging Face ``tokenizers``.

Both need no download: the byte tokenizer is fixed, and the BPE one is trained on the
run's own corpus (or loaded from a ``tokenizer.json`` the user supplies; a Hugging Face
model folder's tokenizer, with its chat template, is ``folder_tokenizer``). Every tokenizer
has a ``name`` that identifies its vocabulary, so token caches can be keyed by it.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from legato.atomic import write_text_atomic
from legato.data._files import fingerprint
from legato.data.sources import read_documents, resolve_paths
from legato.errors import DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HfTokenizer

    from legato.data.chat_template import ChatTemplate

TOKENIZER_FILE = "tokenizer.json"  # the tokenizers library's file, as HF folders name it

EOS_TOKEN = "<|endoftext|>"
BYTE_PAD_TOKEN = "<|pad|>"
# End-of-text spellings of common published tokenizer.json files, tried in order.
_EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>")
_MIN_BPE_VOCAB = 257  # the 256 byte symbols plus the end-of-text token


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline and the trainer need from a tokenizer."""

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int
    eos_token: str
    pad_token: str
    chat_template: ChatTemplate | None  # a model folder's; None for byte, BPE, a bare file

    def encode(self, text: str) -> list[int]:
        """``text`` as a whole sequence: with the special tokens (a BOS) its tokenizer puts
        around one, as transformers' ``encode`` does; byte and BPE put none."""
        ...

    def encode_plain(self, text: str) -> list[int]:
        """``text``'s own tokens, no special tokens around them (a continuation)."""
        ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255, end-of-text is 256 and padding 257 (vocab 258)."""

    name = "byte"
    vocab_size = 258
    eos_id = 256
    pad_id = 257
    eos_token = EOS_TOKEN
    pad_token = BYTE_PAD_TOKEN
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_plain(self, text: str) -> list[int]:
        return self.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Special ids are dropped; a byte sequence cut mid-character decodes to U+FFFD."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def save(self, path: str | Path) -> Path:
        """Write an equivalent ``tokenizer.json`` (Hugging Face ``tokenizers``) atomically.

        A byte-level BPE with no merges whose vocabulary maps each byte's GPT-2 symbol to
        the byte's value, plus the two special tokens: it encodes any text to the same ids
        as :meth:`encode`, except that the literal text ``<|endoftext|>`` becomes id 256,
        as it does with every ``tokenizers`` model that has the special token.
        """
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HfTokenizer

        symbols = _gpt2_byte_symbols()
        vocab = {symbols[b]: b for b in range(256)}
        backend = HfTokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in (EOS_TOKEN, BYTE_PAD_TOKEN)]
        )
        return write_text_atomic(path, backend.to_str())

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def read_tokenizer_json(path: str | Path, where: str = "data.tokenizer") -> HfTokenizer:
    """A ``tokenizer.json``'s ``tokenizers`` model; a missing or unreadable file is a
    one-line DataError naming ``where``, the field or flag that gave the path."""
    from tokenizers import Tokenizer as HfTokenizer

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{where}: file not found: {path}")
    try:
        return HfTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{where}: {path} is not a valid tokenizer.json ({reason})") from None


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


class BpeTokenizer:
    """A Hugging Face ``tokenizers`` model; end-of-text doubles as padding.

    A bare ``tokenizer.json`` encodes a text to its own tokens only, whatever its
    post-processor would add (``add_special_tokens``), as legato has always read one.
    """

    kind = "bpe"  # the prefix of ``name``
    add_special_tokens = False
    chat_template = None

    def __init__(
        self,
        backend: HfTokenizer,
        source: str = "<memory>",
        where: str = "data.tokenizer",
        eos_token: str | None = None,
    ) -> None:
        """``eos_token``: the end-of-text token its folder names; else the first of the
        usual spellings the vocabulary has."""
        self._tok = backend
        self.source = source
        eos = eos_token or next(
            (t for t in _EOS_CANDIDATES if backend.token_to_id(t) is not None), None
        )
        if eos is None:
            raise DataError(
                f"{where}: {source} has no end-of-text token (looked for {', '.join(_EOS_CANDIDATES)})"
            )
        if backend.token_to_id(eos) is None:
            raise DataError(f"{where}: {source}: the eos_token {eos!r} is not in the vocabulary")
        self.eos_token = eos
        self.eos_id = int(backend.token_to_id(eos))
        self.pad_id = self.eos_id
        self.pad_token = eos
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        digest = hashlib.blake2b(backend.to_str().encode("utf-8"), digest_size=6).hexdigest()
        self.name = f"{self.kind}-{self.vocab_size}-{digest}"

    @classmethod
    def load(cls, path: str | Path, where: str = "data.tokenizer") -> BpeTokenizer:
        """Load a ``tokenizer.json`` (see ``read_tokenizer_json``)."""
        return cls(read_tokenizer_json(path, where), source=str(path), where=where)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically."""
        text = self._tok.to_str()
        return write_text_atomic(path, text)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids

    def encode_plain(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        added = self.add_special_tokens
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=added)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"BpeTokenizer({self.name!r}, source={self.source!r})"


def train_bpe(
    files: str | Path | Sequence[str | Path],
    vocab_size: int,
    out_path: str | Path,
    *,
    text_field: str = "text",
) -> BpeTokenizer:
    """Train a byte-level BPE on the documents of ``files`` and save it to ``out_path``.

    The 256 byte symbols are always in the vocabulary, so any text encodes; the trained
    vocabulary may come out smaller than ``vocab_size`` when the corpus is small.
    """
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size < _MIN_BPE_VOCAB:
        raise DataError(
            f"data.bpe_vocab_size: BPE needs at least {_MIN_BPE_VOCAB}, got {vocab_size!r}"
        )
    backend = HfTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(read_documents(files, text_field=text_field), trainer)
    tokenizer = BpeTokenizer(backend, source=str(out_path))
    tokenizer.save(out_path)
    return tokenizer


def load_tokenizer(
    spec: str | Path,
    *,
    train_files: str | Path | Sequence[str | Path] | None = None,
    vocab_size: int | None = None,
    cache_dir: str | Path | None = None,
    text_field: str = "text",
    where: str = "data.tokenizer",
    trains: bool = True,
) -> ByteTokenizer | BpeTokenizer:
    """Resolve ``data.tokenizer`` (or the field or flag ``where`` names in errors):
    ``"byte"``, ``"bpe"``, a path to a ``tokenizer.json``, or a folder: a Hugging Face model
    folder (one with ``tokenizer_config.json`` or ``chat_template.jinja``) gives its
    tokenizer with special tokens and chat template (``folder_tokenizer``), any other
    folder the ``tokenizer.json`` in it.

    ``"bpe"`` trains on ``train_files`` with ``vocab_size`` and caches the result in
    ``cache_dir`` as ``tokenizer-<key>.json``, keyed by the files (paths, sizes, mtimes),
    the vocabulary size and the text field, so a later run loads it instead of retraining.
    A field that only loads (``trains=False``: ``serve --tokenizer``, finetune's
    ``run.tokenizer``) takes ``"byte"`` or a path.
    """
    spec_str = str(spec)
    if spec_str == "byte":
        return ByteTokenizer()
    if spec_str == "bpe" and trains:
        return _cached_bpe(train_files, vocab_size, cache_dir, text_field)
    path = Path(spec_str).expanduser()
    if path.is_dir():
        from legato.data.folder_tokenizer import FolderTokenizer, is_model_folder

        if is_model_folder(path):
            return FolderTokenizer.load(path, where)
        path = path / TOKENIZER_FILE
    if not path.is_file():
        allowed = "'byte', 'bpe'" if trains else "'byte'"
        raise DataError(
            f"{where}: must be {allowed} or a path to a tokenizer.json; file not found: {path}"
        )
    return BpeTokenizer.load(path, where)


def _cached_bpe(
    train_files: str | Path | Sequence[str | Path] | None,
    vocab_size: int | None,
    cache_dir: str | Path | None,
    text_field: str,
) -> BpeTokenizer:
    if not train_files:
        raise DataError("data.tokenizer: 'bpe' is trained on data.paths, which is empty")
    if vocab_size is None:
        raise DataError("data.bpe_vocab_size: 'bpe' needs a vocabulary size (e.g. 4096)")
    files = resolve_paths(train_files)
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = fingerprint("bpe", stats, vocab_size, text_field)
    if cache_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return train_bpe(files, vocab_size, Path(tmp) / TOKENIZER_FILE, text_field=text_field)
    path = Path(cache_dir) / f"tokenizer-{key}.json"
    if path.is_file():
        return BpeTokenizer.load(path)
    return train_bpe(files, vocab_size, path, text_field=text_field)
