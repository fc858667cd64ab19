"""Chat requests through the server with a model folder's tokenizer: the engine gets the
prompt the chat template renders (transformers' ids, the reference), a completion prompt gets
the folder's BOS, a template that refuses the messages is a 400 naming ``messages``, and a
tokenizer without a template keeps the plain ``role: content`` prompt."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from chat_folders import CHATS, llama3_folder
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import load_served_model
from legato.serve.server import create_app

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return llama3_folder(tmp_path_factory.mktemp("llama3"))


def _client(tokenizer=None):
    """A TestClient of the tiny model's server and the prompts its engine was given."""
    model, tok, name = load_served_model("tiny", tokenizer=tokenizer and str(tokenizer))
    engine = Engine(model, tok, {}, EngineConfig(block_size=8, num_blocks=64), model_name=name)
    prompts = []
    add = engine.add

    def recording_add(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return add(prompt, *args, **kwargs)

    engine.add = recording_add
    return TestClient(create_app(engine)), prompts, tok


def _chat(client, messages):
    return client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0})  # fmt: skip


def test_chat_prompt_is_the_rendered_template(folder):
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    client, prompts, _ = _client(folder)
    with client:
        for chat in CHATS:
            reply = _chat(client, chat)
            assert reply.status_code == 200, reply.text
            expected = ref.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
            assert prompts[-1] == expected
            assert reply.json()["usage"]["prompt_tokens"] == len(expected)
        reply = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hello",
                                                     "max_tokens": 2})  # fmt: skip
        assert reply.status_code == 200 and prompts[-1] == ref.encode("Hello")


def test_a_template_that_refuses_the_messages_is_a_400_naming_messages(folder):
    client, prompts, _ = _client(folder)
    with client:
        reply = _chat(client, [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages: the chat template refused the messages: Only")
    assert prompts == []


def test_a_tokenizer_without_template_keeps_role_lines():
    client, prompts, tok = _client()
    with client:
        reply = _chat(client, CHATS[1][:2])
    assert reply.status_code == 200, reply.text
    text = "system: You are a helpful assistant.\nuser: The capital of France?\nassistant:"
    assert prompts[-1] == tok.encode(text)
