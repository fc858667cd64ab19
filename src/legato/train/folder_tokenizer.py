"""The tokenizer that goes with a Hugging Face model folder (``serve --model DIR``,
finetune's ``base.weights = DIR``): the one given, else the folder's ``tokenizer.json``.

A folder without one is an error rather than a silent byte tokenizer, whose ids would
mean nothing to the model.
"""

from __future__ import annotations

from pathlib import Path

from legato.data.tokenizer import Tokenizer, load_tokenizer
from legato.errors import DataError

TOKENIZER_FILE = "tokenizer.json"


def folder_tokenizer(folder: Path, given: str | None, where: str) -> Tokenizer:
    """``given`` ('byte' or a tokenizer.json path) when set, else ``folder``'s own."""
    if given:
        return load_tokenizer(given, where=where, trains=False)
    if not (folder / TOKENIZER_FILE).is_file():
        raise DataError(
            f"{where}: {folder} has no {TOKENIZER_FILE}; give one ('byte' or a path to a "
            f"{TOKENIZER_FILE})"
        )
    return load_tokenizer(folder, where=where, trains=False)
