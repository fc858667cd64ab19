"""One task's training data: JSONL examples packed into fixed-length sequences, no padding.

Each example is ``prompt + response + end-of-text`` (only the response and the end-of-text
are trained on), ``text + end-of-text`` (all trained on), or a chat: ``messages`` (a list of
``{"role", "content"}``) rendered by the tokenizer's chat template, of which only the
assistant turns are trained on, each answer with the end-of-turn marker the template
writes after it (TRL's ``assistant_only_loss``; no end-of-text is added). Examples are laid
end to end in one stream; a task's sequences are windows of that stream (``PackedDataset``
draws them, shuffled per epoch), so every sequence holds exactly ``seq_len`` real tokens
and tasks of different lengths need no padding to be fused. Inside a window, attention and
position ids restart at each example boundary, and a label is kept only if it belongs to
the same example as its input, so packed neighbours never leak into each other. An example
longer than a window is chunked: its continuation starts the next window at position 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from legato.data.dataset import PackedDataset
from legato.data.sources import iter_jsonl
from legato.data.tokenizer import Tokenizer
from legato.errors import DataError

IGNORE = -100  # label of a token that is not trained on (torch's cross-entropy default)


@dataclass(frozen=True)
class TaskStream:
    """Token ids, whether each token is a training target, and its example index."""

    tokens: np.ndarray  # int64 [n]
    targets: np.ndarray  # bool [n]
    docs: np.ndarray  # int64 [n], non-decreasing


@dataclass(frozen=True)
class Sequences:
    """``n`` packed sequences of one task, ready for the backbone."""

    input_ids: Tensor  # int64 [n, L]
    labels: Tensor  # int64 [n, L]; IGNORE where not trained on
    position_ids: Tensor  # int64 [n, L]; restart at 0 at each example start
    attn_mask: Tensor | None  # bool [n, 1, L, L] (True = may attend); None = plain causal

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    def rows(self, start: int, stop: int) -> Sequences:
        mask = None if self.attn_mask is None else self.attn_mask[start:stop]
        return Sequences(
            self.input_ids[start:stop],
            self.labels[start:stop],
            self.position_ids[start:stop],
            mask,
        )

    def to(self, device: torch.device) -> Sequences:
        mask = None if self.attn_mask is None else self.attn_mask.to(device)
        return Sequences(
            self.input_ids.to(device),
            self.labels.to(device),
            self.position_ids.to(device),
            mask,
        )


def _chat(messages: object, tokenizer: Tokenizer, where: str) -> tuple[list[int], list[bool]]:
    """A chat example's tokens and which are trained on (its assistant turns)."""
    if tokenizer.chat_template is None:
        raise DataError(f"{where}: 'messages' needs a tokenizer with a chat template (a model "
                        "folder's), not the byte or BPE one")  # fmt: skip
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise DataError(f"{where}: 'messages' must be a non-empty list of objects with a 'role'")
    try:
        tokens, targets = tokenizer.chat_tokens(messages)
    except DataError as exc:
        raise DataError(f"{where}: messages: {exc}") from None
    if not any(targets):
        raise DataError(f"{where}: 'messages' has no assistant turn to train on")
    return tokens, targets


def _tokens(record: object, tokenizer: Tokenizer, where: str) -> tuple[list[int], list[bool]]:
    """One record's tokens and which are trained on; the prompt is encoded as a whole (with
    the BOS its tokenizer adds), the response as its continuation."""
    if isinstance(record, dict) and "messages" in record:
        return _chat(record["messages"], tokenizer, where)
    prompt, completion = _example(record, where)
    head = tokenizer.encode(prompt) if prompt else []
    tail = tokenizer.encode_plain(completion) if prompt else tokenizer.encode(completion)
    tail = [*tail, tokenizer.eos_id]
    return head + tail, [False] * len(head) + [True] * len(tail)


def _example(record: object, where: str) -> tuple[str, str]:
    """(prompt, completion) of one JSONL record; a plain text has an empty prompt."""
    if isinstance(record, dict) and "prompt" in record and "response" in record:
        prompt, response = record["prompt"], record["response"]
    elif isinstance(record, dict) and "text" in record:
        prompt, response = "", record["text"]
    else:
        raise DataError(f"{where}: expected 'prompt' and 'response', 'text', or 'messages'")
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise DataError(f"{where}: 'prompt', 'response' and 'text' must be strings")
    return prompt, response


def read_task_stream(path: str | Path, tokenizer: Tokenizer) -> TaskStream:
    """Tokenise a JSONL file of examples into one stream (see the module docstring)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    tokens: list[int] = []
    targets: list[bool] = []
    docs: list[int] = []
    for lineno, record in iter_jsonl(path):
        ids, trained = _tokens(record, tokenizer, f"{path}:{lineno}")
        tokens += ids
        targets += trained
        docs += [docs[-1] + 1 if docs else 0] * len(ids)
    if not tokens:
        raise DataError(f"{path}: no examples")
    return TaskStream(
        np.asarray(tokens, dtype=np.int64),
        np.asarray(targets, dtype=bool),
        np.asarray(docs, dtype=np.int64),
    )


class TaskSampler:
    """Draws a task's sequences: shuffled windows of its stream, epoch after epoch."""

    def __init__(self, stream: TaskStream, seq_len: int, seed: int) -> None:
        if len(stream.tokens) < seq_len + 1:
            raise DataError(
                f"{len(stream.tokens)} tokens are fewer than one sequence of seq_len + 1 = "
                f"{seq_len + 1}; add examples or lower seq_len"
            )
        self.stream = stream
        self.seq_len = seq_len
        self._windows = PackedDataset(np.arange(len(stream.tokens)), seq_len, seed=seed)

    def next(self, count: int) -> Sequences:
        """The next ``count`` sequences of ``seq_len`` tokens."""
        inputs, shifted = (t.numpy() for t in self._windows.next_batch(count))
        s = self.stream
        docs = s.docs[inputs]
        same_doc = s.docs[shifted] == docs
        labels = np.where(s.targets[shifted] & same_doc, s.tokens[shifted], IGNORE)
        starts = np.ones_like(docs, dtype=bool)
        starts[:, 1:] = docs[:, 1:] != docs[:, :-1]
        index = np.broadcast_to(np.arange(self.seq_len), docs.shape)
        first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
        docs_t = torch.from_numpy(docs)
        mask = None
        if starts[:, 1:].any():
            causal = torch.ones(self.seq_len, self.seq_len, dtype=torch.bool).tril()
            mask = (docs_t[:, :, None] == docs_t[:, None, :]) & causal
            mask = mask.unsqueeze(1)
        return Sequences(
            torch.from_numpy(s.tokens[inputs]),
            torch.from_numpy(labels),
            torch.from_numpy(index - first),
            mask,
        )
