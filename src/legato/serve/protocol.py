"""The OpenAI request bodies the server accepts, and the JSON it answers with.

Fields and defaults follow the OpenAI completions and chat completions APIs, plus vLLM's
extensions (``top_k``, ``ignore_eos``) and its LoRA management bodies. A field outside its
range is a 400 with OpenAI's error object naming it (``error_body``), never a 422.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from legato.data.tokenizer import Tokenizer
from legato.errors import DataError
from legato.serve.sampling import RequestError, SamplingParams


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: StrictBool = False  # as OpenAI: true or false, not "yes" or 1
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False

    @property
    def length_field(self) -> str:
        """The field that asks for the answer's length (what an error about it names)."""
        return "max_tokens"

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        if self.n != 1:
            raise RequestError(f"n: only n = 1 is supported, got {self.n}", 400, "n")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        asked = getattr(self, self.length_field)
        return SamplingParams(
            max_tokens=default_max_tokens if asked is None else asked,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            stop=tuple(stop), ignore_eos=self.ignore_eos,
        )  # fmt: skip

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = 16

    def prompt_ids(self, tokenizer: Tokenizer) -> list[int]:
        """The ids sent, or the text encoded as a whole (with the BOS its tokenizer adds, as
        vLLM encodes a completion prompt)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise RequestError("prompt: one prompt per request (a list of one)", 400, "prompt")
            prompt = prompt[0]
        return tokenizer.encode(prompt)


OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")  # without a template


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. tool_calls: what the template reads

    role: str = Field(min_length=1)  # which roles a chat template takes is the template's say
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens

    @property
    def length_field(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def prompt_ids(self, tokenizer: Tokenizer) -> list[int]:
        """The messages rendered by the tokenizer's chat template with the generation prompt
        and encoded with nothing added (the template writes its own BOS), as vLLM does; a
        template that refuses them is a 400 naming ``messages``. Only a tokenizer without a
        template (the byte and BPE demo tokenizers) gets our plain format: one line per
        message, ``role: content``, then ``assistant:`` for the answer."""
        template = tokenizer.chat_template
        if template is None:
            for i, m in enumerate(self.messages):
                if m.role not in OPENAI_ROLES:
                    where = f"messages.{i}.role"
                    raise RequestError(
                        f"{where}: must be one of {', '.join(OPENAI_ROLES)} (this model has no "
                        f"chat template to take others), got {m.role!r}", 400, where,
                    )  # fmt: skip
            lines = [f"{m.role}: {m.content}" for m in self.messages]
            return tokenizer.encode("\n".join([*lines, "assistant:"]))
        messages = [m.model_dump() for m in self.messages]
        try:
            return tokenizer.encode_plain(template.render(messages, add_generation_prompt=True))
        except DataError as exc:
            raise RequestError(f"messages: {exc}", 400, "messages") from None


class LoadLora(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str


class UnloadLora(BaseModel):
    lora_name: str = Field(min_length=1)


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kinds = {401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
             429: "RateLimitError", 500: "InternalServerError"}  # fmt: skip
    kind = kinds.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def model_list(base: str, adapters: dict[str, str]) -> dict[str, Any]:
    """``/v1/models``: the base model, then each adapter (name -> where it was loaded from)
    with the base as its ``parent``, as vLLM lists LoRA adapters."""
    created = int(time.time())
    rows = [{"id": base, "object": "model", "created": created, "owned_by": "legato",
             "root": base, "parent": None}]  # fmt: skip
    for name, root in adapters.items():
        rows.append({"id": name, "object": "model", "created": created, "owned_by": "legato",
                     "root": root, "parent": base})  # fmt: skip
    return {"object": "list", "data": rows}


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def completion_body(request_id, model, text, finish, chat: bool, usage_: dict | None) -> dict:
    """A whole answer (``usage_`` given) or one streamed chunk of it."""
    if chat:
        key = "message" if usage_ is not None else "delta"
        choice = {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}
        kind = "chat.completion" if usage_ is not None else "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    body = {"id": request_id, "object": kind, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip
    if usage_ is not None:
        body["usage"] = usage_
    return body
