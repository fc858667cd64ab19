"""A trained model read back from a run: the weights of a checkpoint, its spec, config and
tokenizer, on one process, for ``legato export``, ``legato eval`` and fine-tuning.

A path may name a run directory (its latest checkpoint), its ``checkpoints/`` folder or one
``checkpoints/step_N`` directory. The checkpoint's ``meta.json`` holds the ModelSpec and the
whole training config, so nothing else needs to be given; DCP reads the model's entries
into a plain model however the run was sharded (FSDP2, DDP, pipeline stages).

A Hugging Face model folder is read the same way (:func:`load_hf_folder`): spec from its
``config.json``, weights from its safetensors, tokenizer from its ``tokenizer.json``; its
"config" is the default training config with ``model.init`` naming it and a sequence length
of at most ``FOLDER_SEQ_LEN`` (a folder states only its longest context).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from legato.data import Tokenizer, load_tokenizer
from legato.data.tokenizer import TOKENIZER_FILE
from legato.errors import CheckpointError, DataError, LegatoError
from legato.models import Transformer, build_model
from legato.models.hf_folder import is_hf_folder, load_weights, read_spec
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict
from legato.train import checkpoint as ckpt
from legato.train.config import DataSection, ModelSection, TrainConfig
from legato.train.run_data import run_tokenizer

FOLDER_SEQ_LEN = 1024  # evaluation windows of a Hugging Face folder (its context if shorter)


@dataclass
class TrainedModel:
    checkpoint: Path
    run_dir: Path | None  # None for a checkpoint copied out of its run
    step: int
    spec: ModelSpec
    config: TrainConfig
    model: Transformer
    tokenizer: Tokenizer

    @property
    def seq_len(self) -> int:
        """The length of the run's training sequences."""
        return self.config.data.seq_len or self.spec.seq_len


def is_legato_run(path: Path) -> bool:
    """A run directory, its ``checkpoints/`` folder or a checkpoint directory."""
    return any(
        (path / name).is_file() for name in (f"checkpoints/{ckpt.LATEST}", ckpt.LATEST, ckpt.META)
    )


def locate_checkpoint(path: str | Path, where: str) -> tuple[Path, Path | None]:
    """(checkpoint directory, run directory or None) for ``path``; ``where`` names the
    argument or field in the one-line error."""
    path = Path(path).expanduser()
    if not path.is_dir() or not is_legato_run(path):
        raise CheckpointError(
            f"{where}: {path} is neither a legato run directory (with checkpoints/latest) "
            f"nor a checkpoint (checkpoints/step_N with {ckpt.META})"
        )
    found = ckpt.checkpoint_at(path)
    run_dir = found.parent.parent if found.parent.name == "checkpoints" else None
    return found, run_dir


def load_trained(
    path: str | Path,
    where: str = "RUN_DIR",
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> TrainedModel:
    """The model of ``path``'s checkpoint (or Hugging Face folder) with its weights."""
    if Path(path).expanduser().is_dir() and is_hf_folder(Path(path).expanduser()):
        return load_hf_folder(path, where, device=device, dtype=dtype)
    checkpoint, run_dir = locate_checkpoint(path, where)
    meta = ckpt.read_meta(checkpoint)
    try:
        spec = from_dict(ModelSpec, meta["model_spec"], "model_spec", CheckpointError)
        config = from_dict(TrainConfig, meta["config"], "config", CheckpointError)
    except LegatoError as exc:
        raise CheckpointError(f"{checkpoint / ckpt.META}: {exc}") from None
    model = build_model(spec, seed=0, device="cpu")
    ckpt.load_model_weights(checkpoint, model)
    model = model.to(device=device, dtype=dtype).eval()
    tokenizer = run_tokenizer(run_dir, config.data)
    return TrainedModel(checkpoint, run_dir, int(meta["step"]), spec, config, model, tokenizer)


def load_hf_folder(
    path: str | Path,
    where: str,
    *,
    spec: ModelSpec | None = None,
    tokenizer: str | None = None,
    tokenizer_field: str = "--tokenizer",
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> TrainedModel:
    """The Hugging Face folder ``path`` as a trained model. ``spec``: the model to build
    (default the folder's own; e.g. with overrides applied); ``tokenizer`` ('byte' or a
    tokenizer.json, named ``tokenizer_field`` in errors) replaces the folder's own."""
    folder = Path(path).expanduser()
    served = _folder_tokenizer(folder, tokenizer, tokenizer_field)
    try:
        spec = spec or read_spec(folder)
        model = build_model(spec, seed=0, device=device, dtype=dtype)
        load_weights(model, folder)
    except LegatoError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    data = DataSection(seq_len=min(spec.seq_len, FOLDER_SEQ_LEN))
    config = TrainConfig(model=ModelSection(init=str(folder)), data=data)
    return TrainedModel(folder, None, 0, spec, config, model.eval(), served)


def _folder_tokenizer(folder: Path, given: str | None, where: str) -> Tokenizer:
    """``given`` ('byte' or a tokenizer.json path) when set, else ``folder``'s own; a
    folder without one is an error rather than a silent byte tokenizer, whose ids would
    mean nothing to the model."""
    if given:
        return load_tokenizer(given, where=where, trains=False)
    if not (folder / TOKENIZER_FILE).is_file():
        raise DataError(
            f"{where}: {folder} has no {TOKENIZER_FILE}; give one ('byte' or a path to a "
            f"{TOKENIZER_FILE})"
        )
    return load_tokenizer(folder, where=where, trains=False)
