"""``model.init``: the weights a run starts from instead of a seeded initialisation.

Either a Hugging Face model folder (``config.json`` + safetensors, ``models.hf_folder``) or
a legato run directory or checkpoint (DCP). The spec must match the run's (``model.preset``
plus ``model.overrides``) in every field that shapes or computes the weights; the name,
the description, the published size and ``seq_len`` may differ (RoPE tables are derived,
so a shorter training context is fine). With ``model.preset`` left at its default, the
spec is ``model.init``'s own. The weights are read after the model is laid out, so each
rank reads only the slices it holds; a resumed run takes its checkpoint's weights instead.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

from torch import nn

from legato.errors import ConfigError, LegatoError
from legato.models.hf_folder import is_hf_folder, load_weights, read_spec
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict, to_dict
from legato.train import checkpoint as ckpt
from legato.train.trained_model import locate_checkpoint

FIELD = "model.init"
# Fields that neither shape the weights nor change what they compute.
_FREE = ("name", "description", "published_params", "seq_len")


def init_spec(path: str) -> ModelSpec:
    """The spec of the folder or checkpoint ``path`` names."""
    folder = Path(path).expanduser()
    try:
        if is_hf_folder(folder):
            return read_spec(folder)
        checkpoint, _ = locate_checkpoint(folder, FIELD)
        meta = json.loads((checkpoint / ckpt.META).read_text(encoding="utf-8"))
        return from_dict(ModelSpec, meta["model_spec"], "model_spec", ConfigError)
    except (LegatoError, OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{FIELD}: {exc}") from None


def check_init_spec(spec: ModelSpec, init: ModelSpec, path: str) -> None:
    """A ConfigError naming the first field where the run's model and ``path``'s differ."""
    ours, theirs = to_dict(spec), to_dict(init)
    for name in _FREE:
        ours.pop(name), theirs.pop(name)
    diff = ckpt.first_difference(theirs, ours)
    if diff:
        raise ConfigError(
            f"{FIELD}: {path} holds another model than model.preset/model.overrides "
            f"describe ({diff.replace('checkpoint has', 'it has')})"
        )


def load_init(path: str, model: nn.Module, only: Collection[str] | None = None) -> None:
    """Collective on a laid-out model: ``path``'s weights into ``model`` (each rank its
    slices); ``only``: the FQNs this rank holds (pipeline stages), the rest untouched."""
    folder = Path(path).expanduser()
    try:
        if is_hf_folder(folder):
            load_weights(model, folder, only=only)
        else:
            checkpoint, _ = locate_checkpoint(folder, FIELD)
            ckpt.read_meta(checkpoint)  # whole and unchanged, before DCP reads it
            ckpt.load_model_weights(checkpoint, model, only=only)
    except LegatoError as exc:
        raise type(exc)(f"{FIELD}: {exc}") from None
