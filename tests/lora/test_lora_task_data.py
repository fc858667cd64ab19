"""Task data: prompt masking, packing without padding, per-example attention and positions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from chat_folders import CHATS, llama3_folder
from legato.data import ByteTokenizer, load_tokenizer
from legato.errors import DataError
from legato.lora.task_data import IGNORE, TaskSampler, TaskStream, read_task_stream


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_prompt_tokens_are_not_trained_on_and_each_example_ends_with_eos(tmp_path):
    path = _write(tmp_path / "t.jsonl", [{"prompt": "ab", "response": "cd"}, {"text": "xy"}])
    stream = read_task_stream(path, ByteTokenizer())
    eos = ByteTokenizer.eos_id
    assert stream.tokens.tolist() == [97, 98, 99, 100, eos, 120, 121, eos]
    assert stream.targets.tolist() == [False, False, True, True, True, True, True, True]
    assert stream.docs.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"prompt": "a"}', "expected 'prompt' and 'response', 'text', or 'messages'"),
        ('{"text": 3}', "must be strings"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"bad.jsonl:2: .*{message}"):
        read_task_stream(path, ByteTokenizer())


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_task_stream(tmp_path / "nope.jsonl", ByteTokenizer())


def test_windows_restart_positions_and_attention_at_example_boundaries():
    # examples: docs 0 (5 tokens), 1 (3 tokens), 2 (rest); tokens 0..15 are their indices
    docs = np.array([0] * 5 + [1] * 3 + [2] * 8)
    targets = np.ones(16, dtype=bool)
    targets[5] = False  # first token of example 1 is a prompt token
    stream = TaskStream(np.arange(16), targets, docs)
    sampler = TaskSampler(stream, seq_len=15, seed=0)
    seqs = sampler.next(1)
    assert seqs.input_ids[0].tolist() == list(range(15))
    assert seqs.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]
    labels = seqs.labels[0].tolist()
    assert labels[4] == IGNORE  # across an example boundary
    assert labels[7] == IGNORE  # next token starts example 2
    assert labels[5] == 6 and labels[0] == 1
    mask = seqs.attn_mask[0, 0]
    assert mask[6, 5] and mask[6, 6] and not mask[6, 4] and not mask[6, 7]
    assert torch.equal(mask[:5, :5], torch.ones(5, 5, dtype=torch.bool).tril())


def test_single_example_windows_use_plain_causal_attention():
    stream = TaskStream(np.arange(40), np.ones(40, dtype=bool), np.zeros(40, dtype=np.int64))
    seqs = TaskSampler(stream, seq_len=8, seed=0).next(3)
    assert seqs.attn_mask is None
    assert seqs.input_ids.shape == (3, 8)
    # each token of a window is labelled by the next one: no padding anywhere
    assert torch.equal(seqs.labels[:, :-1], seqs.input_ids[:, 1:])


def test_stream_shorter_than_one_sequence_is_an_error():
    stream = TaskStream(np.arange(5), np.ones(5, dtype=bool), np.zeros(5, dtype=np.int64))
    with pytest.raises(DataError, match="fewer than one sequence"):
        TaskSampler(stream, seq_len=8, seed=0)


def test_chat_rows_train_only_on_the_assistant_turns(tmp_path):
    tok = load_tokenizer(llama3_folder(tmp_path / "llama3"))
    chat = CHATS[2]
    path = _write(tmp_path / "chat.jsonl", [{"messages": chat}, {"prompt": "Hi", "response": "ok"}])
    stream = read_task_stream(path, tok)
    ids, mask = tok.chat_tokens(chat)
    n = len(ids)
    assert stream.tokens[:n].tolist() == ids and stream.targets[:n].tolist() == mask
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and mask[-1]  # <|eot_id|>, trained
    assert set(stream.docs[:n].tolist()) == {0} and set(stream.docs[n:].tolist()) == {1}
    # prompt and response: BOS once, before the prompt; the response is its continuation
    head, tail = tok.encode("Hi"), [*tok.encode_plain("ok"), tok.eos_id]
    assert stream.tokens[n:].tolist() == head + tail
    assert stream.targets[n:].tolist() == [False] * len(head) + [True] * len(tail)


@pytest.mark.parametrize(
    ("messages", "byte", "message"),
    [
        (CHATS[0], True, "needs a tokenizer with a chat template"),
        ([], False, "must be a non-empty list of objects with a 'role'"),
        (CHATS[0], False, "has no assistant turn to train on"),
        ([{"role": "tool", "content": "x"}], False, "messages: the chat template refused"),
    ],
)
def test_bad_chat_rows_name_file_and_line(tmp_path, messages, byte, message):
    tok = ByteTokenizer() if byte else load_tokenizer(llama3_folder(tmp_path / "llama3"))
    path = _write(tmp_path / "bad.jsonl", [{"text": "fine"}, {"messages": messages}])
    with pytest.raises(DataError, match=f"bad.jsonl:2: .*{message}"):
        read_task_stream(path, tok)
