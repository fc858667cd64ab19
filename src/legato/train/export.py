"""``legato export``: a trained checkpoint as a Hugging Face model folder.

The folder holds what ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read: ``config.json`` (the HF architecture computing the
spec, ``specs.hf_config``), the weights as safetensors under HF names
(``models.hf_checkpoint``), ``generation_config.json``, and ``tokenizer.json`` with a
``tokenizer_config.json`` for ``PreTrainedTokenizerFast``. It is written into a temp folder
beside the target and renamed at the end, so an interrupted export leaves no half folder
and an existing target is only replaced by a complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from legato.atomic import make_temp_dir
from legato.data import Tokenizer
from legato.data.tokenizer import TOKENIZER_FILE
from legato.errors import ConfigError
from legato.models import Transformer
from legato.models.hf_checkpoint import save_safetensors
from legato.specs.hf_config import hf_architecture
from legato.train.trained_model import TrainedModel


def tokenizer_config(tokenizer: Tokenizer, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the fast tokenizer class and its special tokens."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }


def _write_json(path: Path, table: dict[str, Any]) -> None:
    path.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")


def export_trained(trained: TrainedModel, out: str | Path) -> Path:
    """Write a run's checkpoint as an HF model folder at ``out`` (replaced atomically)."""
    source = {"checkpoint": str(trained.checkpoint), "step": trained.step}
    return export_hf(trained.model, trained.tokenizer, out, source)


def export_hf(
    model: Transformer, tok: Tokenizer, out: str | Path, source: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` and ``tok`` as an HF model folder at ``out`` (replaced atomically);
    ``source`` (where the weights came from) goes to ``legato_export.json``."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT: {out} exists and is not a directory")
    arch = hf_architecture(model.spec)  # refuse before writing anything
    tmp = make_temp_dir(out)
    try:
        config = {
            **arch.config,
            "eos_token_id": tok.eos_id,
            "pad_token_id": tok.pad_id,
            "bos_token_id": None,
        }
        _write_json(tmp / "config.json", config)
        _write_json(
            tmp / "generation_config.json",
            {"eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id, "bos_token_id": None},
        )
        save_safetensors(model, tmp, hf_style=arch.hf_style)
        tok.save(tmp / TOKENIZER_FILE)
        _write_json(tmp / "tokenizer_config.json", tokenizer_config(tok, model.spec.seq_len))
        _write_json(tmp / "legato_export.json", {**(source or {}), "architecture": arch.name})
        old = None
        if out.exists():  # move the old folder aside first: never a moment without one
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
