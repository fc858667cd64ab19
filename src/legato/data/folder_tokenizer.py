"""A Hugging Face model folder's tokenizer: ``tokenizer.json`` with the special tokens and
chat template of ``tokenizer_config.json`` (or of ``chat_template.jinja``, which newer
transformers write and which wins over the config's, as there).

Read with ``tokenizers`` and our own template renderer, never transformers, and encoding
as ``AutoTokenizer.from_pretrained(folder)`` (transformers 5) does: what goes around a
text (a BOS) is what tokenizer.json's post-processor adds — transformers ignores the
config's ``add_bos_token`` when a tokenizer.json is there — and a rendered chat is encoded
with nothing added, the template writing its own BOS. A folder with only a
``tokenizer.model`` (sentencepiece, no tokenizer.json) is not read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from legato.atomic import write_text_atomic
from legato.data.chat_template import ChatTemplate, Message
from legato.data.tokenizer import TOKENIZER_FILE, BpeTokenizer, read_tokenizer_json
from legato.errors import DataError

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# The named special tokens transformers passes to a chat template (``special_tokens_map``).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")  # fmt: skip


def is_model_folder(path: Path) -> bool:
    """Whether ``path`` is a Hugging Face model folder (not just a folder with a tokenizer.json)."""
    return (path / CONFIG_FILE).is_file() or (path / TEMPLATE_FILE).is_file()


def _special_tokens(config: dict[str, Any], where: str) -> dict[str, str]:
    """The named special tokens of ``tokenizer_config.json``: a string, or an AddedToken
    object (``{"content": ...}``)."""
    tokens = {}
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise DataError(f"{where}: {key} must be a string or an object with 'content'")
        tokens[key] = value
    return tokens


def _template_source(folder: Path, config: dict[str, Any], where: str) -> str | None:
    """``chat_template.jinja``, else the config's ``chat_template`` (a string, or a list of
    named templates of which the one named ``default`` is used, as transformers does
    without tools)."""
    if (folder / TEMPLATE_FILE).is_file():
        return (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if "default" not in named:
            raise DataError(
                f"{where}: chat_template lists templates {sorted(map(str, named))} but none "
                "named 'default'"
            )
        source = named["default"]
    if source is not None and not isinstance(source, str):
        raise DataError(f"{where}: chat_template must be a string or a list of named templates")
    return source


class FolderTokenizer(BpeTokenizer):
    """``tokenizer.json`` read as its model folder says: special tokens, chat template."""

    kind = "hf"
    add_special_tokens = True  # whatever tokenizer.json's post-processor adds, as transformers

    def __init__(self, backend, source: str, where: str, config: dict[str, Any],
                 template: str | None) -> None:  # fmt: skip
        special = _special_tokens(config, f"{where}: {CONFIG_FILE}")
        super().__init__(backend, source, where, eos_token=special.get("eos_token"))
        self.special_tokens = special
        self.bos_token = special.get("bos_token")
        self.bos_id = None if self.bos_token is None else backend.token_to_id(self.bos_token)
        pad = special.get("pad_token")
        if pad is not None and backend.token_to_id(pad) is not None:
            self.pad_token, self.pad_id = pad, int(backend.token_to_id(pad))
        self.chat_template = None if template is None else ChatTemplate(
            template, special, f"{where}: {source} chat template"
        )  # fmt: skip

    @classmethod
    def load(cls, folder: str | Path, where: str = "data.tokenizer") -> FolderTokenizer:
        """Read a model folder; what is missing or malformed is one DataError naming ``where``."""
        folder = Path(folder)
        if not (folder / TOKENIZER_FILE).is_file():
            raise DataError(f"{where}: {folder} has no tokenizer.json (sentencepiece-only "
                            "folders are not read)")  # fmt: skip
        config_path = folder / CONFIG_FILE
        try:
            config = json.loads(config_path.read_text("utf-8")) if config_path.is_file() else {}
        except (OSError, ValueError) as exc:
            raise DataError(f"{where}: {config_path} is not readable JSON ({exc})") from None
        if not isinstance(config, dict):
            raise DataError(f"{where}: {config_path} must hold a JSON object")
        backend = read_tokenizer_json(folder / TOKENIZER_FILE, where)
        template = _template_source(folder, config, f"{where}: {config_path}")
        return cls(backend, str(folder), where, config, template)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` and beside it a ``tokenizer_config.json`` with the special
        tokens and chat template, so that folder loads back as this tokenizer."""
        out = super().save(path)
        config = dict(self.special_tokens)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template.source
        write_text_atomic(out.parent / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        return out

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        """``messages`` rendered by the folder's template (a DataError if it has none)."""
        return self._template().render(messages, add_generation_prompt)

    def chat_tokens(self, messages: Sequence[Message]) -> tuple[list[int], list[bool]]:
        """A whole chat's token ids and, for each, whether it belongs to an assistant turn
        (a token that overlaps one: TRL's ``assistant_only_loss`` masks the same way)."""
        text, spans = self._template().assistant_spans(messages)
        encoding = self._tok.encode(text, add_special_tokens=False)
        mask = [any(start < end_s and end > start_s for start_s, end_s in spans)
                for start, end in encoding.offsets]  # fmt: skip
        return encoding.ids, mask

    def _template(self) -> ChatTemplate:
        if self.chat_template is None:
            raise DataError(f"{self.source} has no chat template")
        return self.chat_template

    def __repr__(self) -> str:
        return f"FolderTokenizer({self.name!r}, source={self.source!r})"
