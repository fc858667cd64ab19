"""A model folder's chat template: the Jinja program that turns messages into prompt text.

Rendered as transformers' ``apply_chat_template`` and vLLM render it, in our own small copy
so that serving and fine-tuning need no transformers: an immutable sandboxed Jinja
environment (a template is code from the folder; the sandbox keeps it from Python's
internals) with ``trim_blocks``, ``lstrip_blocks`` and loop controls, the globals
``raise_exception`` and ``strftime_now``, a ``tojson`` that does not escape HTML, and the
folder's special tokens (``bos_token``, ``eos_token``, ...) as variables. TRL's
``{% generation %}`` markers render their body, so templates that carry them load too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from legato.errors import DataError

Message = Mapping[str, Any]


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it a class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ChatTemplate:
    """A compiled template and the special-token variables it renders with."""

    def __init__(self, source: str, tokens: Mapping[str, str], where: str) -> None:
        """``where`` names the file or field the template came from, in errors."""
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise DataError(
                f"{where}: not a valid Jinja template ({exc.message}, line {exc.lineno})"
            ) from None
        self.source = source
        self.tokens = dict(tokens)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (keys whose value is None dropped, as transformers
        does); ``add_generation_prompt`` appends the header that opens the assistant's turn.
        Whatever the template raises (a role it rejects, a missing key) is a DataError."""
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self._template.render(
                messages=chat, tools=None, documents=None,
                add_generation_prompt=add_generation_prompt, **self.tokens,
            )  # fmt: skip
        except (
            Exception
        ) as exc:  # the template is the folder's code: any failure is about the input
            raise DataError(f"the chat template refused the messages: {_first_line(exc)}") from None

    def assistant_spans(self, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
        """The whole chat's text and the character span of each assistant turn in it: what
        the template writes after the generation prompt for that turn, up to the next
        message (the answer and its end-of-turn marker). Found by rendering the chat's
        beginnings, so the template must render a beginning as the beginning of the whole
        (ChatML, Llama 3 and most do; one that rewrites earlier turns is refused)."""
        text = self.render(messages, add_generation_prompt=False)
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            head = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1], add_generation_prompt=False)
            if not (upto.startswith(head) and text.startswith(upto)):
                raise DataError(
                    f"the chat template renders the chat up to message {i} differently from "
                    "the start of the whole chat, so its assistant turns cannot be told apart"
                )
            spans.append((len(head), len(upto)))
        return text, spans
