"""Training data: tokenizers, document sources, token caches, packed resumable batches.

The public API (stable; the trainer codes against these names)::

    ByteTokenizer()                                   # vocab 258: bytes, eos=256, pad=257
    load_tokenizer(spec, *, train_files=None, vocab_size=None, cache_dir=None,
                   text_field="text") -> Tokenizer    # spec: "byte" | "bpe" | path to tokenizer.json
                                                      # | HF model folder (-> FolderTokenizer)
    FolderTokenizer: .bos_id; .apply_chat_template(messages, add_generation_prompt=True) -> str;
        .chat_tokens(messages) -> (ids, assistant_mask)
    read_documents(paths, *, text_field="text") -> Iterator[str]
    prepare_tokens(paths, tokenizer, *, text_field="text", cache_dir=None,
                   progress=None) -> np.ndarray       # uint16 / uint32, eos after each document
    PackedDataset(tokens, seq_len, *, seed, shuffle=True)
        .num_sequences; .next_batch(global_batch, rank=0, world=1, split=None) -> (inputs, labels)
        .state_dict() -> dict; .load_state_dict(state)
    split_tokens(tokens, holdout) -> (train_tokens, val_tokens)
    builtin_corpus_path(cache_dir, *, seed=0, target_bytes=3_000_000) -> Path

Every user mistake (missing file, bad JSON line, wrong column, corrupt tokenizer, a resume
state of another dataset) raises ``legato.errors.DataError`` with a one-line message.
"""

from legato.data.builtin_corpus import builtin_corpus_path, generate_documents
from legato.data.dataset import PackedDataset, split_tokens
from legato.data.sources import read_documents, resolve_paths
from legato.data.tokenizer import (
    BpeTokenizer,
    ByteTokenizer,
    Tokenizer,
    load_tokenizer,
    train_bpe,
)
from legato.data.tokens import prepare_tokens, token_dtype

__all__ = [
    "BpeTokenizer",
    "ByteTokenizer",
    "PackedDataset",
    "Tokenizer",
    "builtin_corpus_path",
    "generate_documents",
    "load_tokenizer",
    "prepare_tokens",
    "read_documents",
    "resolve_paths",
    "split_tokens",
    "token_dtype",
    "train_bpe",
]
