"""A model folder's tokenizer and chat template against transformers (the reference, only
here): the same ids (BOS as the folder's post-processor adds it), the same rendered chats
and assistant masks, the same template features; and our errors, one line each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chat_folders import CHATS, GENERATION_TEMPLATE, llama3_folder, qwen_folder
from legato.data import BpeTokenizer, load_tokenizer
from legato.data.folder_tokenizer import FolderTokenizer
from legato.errors import DataError

transformers = pytest.importorskip("transformers")

TEXTS = ["Hello, how are you?", "Grüße aus Köln! 東京 🚀", "<|im_end|> and <|eot_id|> literal",
         "  two  spaces\n\nand lines", ""]  # fmt: skip
TOOL_CHAT = [
    {"role": "user", "content": "Weather in 東京?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"name": "weather", "arguments": {"city": "東京", "html": "<b>&</b>"}}]},
    {"role": "tool", "content": "sunny"},
]  # fmt: skip


@pytest.fixture(scope="module", params=["llama3", "qwen"])
def folder(request, tmp_path_factory):
    make = llama3_folder if request.param == "llama3" else qwen_folder
    return make(tmp_path_factory.mktemp(request.param))


def _reference(folder):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_ids_and_special_tokens_match_transformers(folder):
    ours, ref = load_tokenizer(folder), _reference(folder)
    assert isinstance(ours, FolderTokenizer)
    assert (ours.bos_id, ours.eos_id, ours.eos_token) == (
        ref.bos_token_id, ref.eos_token_id, ref.eos_token)  # fmt: skip
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.encode_plain(text) == ref.encode(text, add_special_tokens=False), text
    assert ours.encode_batch(TEXTS) == [ref.encode(t) for t in TEXTS]
    assert ours.decode(ours.encode(TEXTS[1])) == TEXTS[1]


def test_bos_is_what_the_post_processor_adds(tmp_path):
    llama, qwen = load_tokenizer(llama3_folder(tmp_path / "l")), load_tokenizer(qwen_folder(tmp_path / "q"))  # fmt: skip
    assert (
        llama.encode("Hello")[0] == llama.bos_id and llama.encode_plain("Hello")[0] != llama.bos_id
    )
    assert qwen.bos_id is None and qwen.encode("Hello") == qwen.encode_plain("Hello")
    assert qwen.pad_token == "<|endoftext|>" and llama.pad_id == llama.eos_id


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_rendered_chats_match_transformers(folder, generation_prompt):
    ours, ref = load_tokenizer(folder), _reference(folder)
    chats = [*CHATS, TOOL_CHAT] if "qwen" in folder.name else CHATS
    for chat in chats:
        text = ours.apply_chat_template(chat, add_generation_prompt=generation_prompt)
        assert text == ref.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert ours.encode_plain(text) == ref.apply_chat_template(
            chat, add_generation_prompt=generation_prompt, return_dict=False
        )


def test_chat_template_jinja_wins_over_the_config(tmp_path):
    tok = load_tokenizer(qwen_folder(tmp_path))
    assert tok.apply_chat_template(CHATS[0]).startswith("<|im_start|>system\nYou are Qwen")


def test_assistant_mask_matches_transformers_generation_markers(tmp_path):
    folder = qwen_folder(tmp_path, GENERATION_TEMPLATE)
    ours, ref = load_tokenizer(folder), _reference(folder)
    for chat in CHATS:
        ids, mask = ours.chat_tokens(chat)
        out = ref.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
        assert ids == out["input_ids"] and [int(m) for m in mask] == out["assistant_masks"]


def test_assistant_turns_are_the_answers_and_their_end_of_turn(tmp_path):
    tok = load_tokenizer(llama3_folder(tmp_path))
    ids, mask = tok.chat_tokens(CHATS[2])
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    eot = tok.encode_plain("<|eot_id|>")
    expected = [*tok.encode_plain("I am fine, thank you."), *eot,
                *tok.encode_plain("Fine, thank you for asking."), *eot]  # fmt: skip
    assert trained == expected


def test_a_template_that_raises_is_one_data_error(tmp_path):
    tok = load_tokenizer(llama3_folder(tmp_path))
    with pytest.raises(DataError, match=r"^the chat template refused the messages: Only user"):
        tok.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]
        )


def test_bad_folders_are_one_line_naming_the_field(tmp_path):
    folder = qwen_folder(tmp_path / "syntax", "{% for m in messages %}")
    with pytest.raises(DataError, match=r"^--tokenizer: .*chat template: not a valid Jinja"):
        load_tokenizer(folder, where="--tokenizer", trains=False)
    folder = llama3_folder(tmp_path / "json")
    (folder / "tokenizer_config.json").write_text("{oops", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"^data.tokenizer: .*tokenizer_config.json is not readable"
    ):
        load_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(DataError, match=r"eos_token '<nope>' is not in the vocabulary"):
        load_tokenizer(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(DataError, match=r"^data.tokenizer: .* has no tokenizer.json"):
        load_tokenizer(folder)
    without_template = llama3_folder(tmp_path / "plain")
    (without_template / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
    with pytest.raises(DataError, match="has no chat template"):
        load_tokenizer(without_template).apply_chat_template(CHATS[0])


def test_a_folder_with_only_tokenizer_json_stays_a_bare_bpe(tmp_path):
    folder = llama3_folder(tmp_path)
    (folder / "tokenizer_config.json").unlink()
    tok = load_tokenizer(folder)
    assert type(tok) is BpeTokenizer and tok.chat_template is None
    assert tok.encode("Hello") == tok.encode_plain("Hello")  # as legato has always read one


def test_reading_a_folder_does_not_import_transformers(tmp_path):
    folder = qwen_folder(tmp_path)
    code = (
        "import sys; from legato.data import load_tokenizer; "
        f"t = load_tokenizer({str(folder)!r}); t.chat_tokens({CHATS[2]!r}); "
        "assert 'transformers' not in sys.modules, 'transformers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_saved_into_a_run_folder_it_loads_back_the_same(folder, tmp_path):
    tok = load_tokenizer(folder)
    tok.save(tmp_path / "run" / "tokenizer.json")
    back = load_tokenizer(tmp_path / "run")
    assert (back.name, back.bos_id, back.eos_id, back.pad_id) == (
        tok.name, tok.bos_id, tok.eos_id, tok.pad_id)  # fmt: skip
    assert back.encode(TEXTS[0]) == tok.encode(TEXTS[0])
    assert back.apply_chat_template(CHATS[1]) == tok.apply_chat_template(CHATS[1])
