"""A trained model read back from a run: the weights of a checkpoint, its spec, config and
tokenizer, on one process, for ``legato export``, ``legato eval`` and fine-tuning.

A path may name a run directory (its latest checkpoint), its ``checkpoints/`` folder or one
``checkpoints/step_N`` directory. The checkpoint's ``meta.json`` holds the ModelSpec and the
whole training config, so nothing else needs to be given; DCP reads the model's entries
into a plain model however the run was sharded (FSDP2, DDP, pipeline stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from legato.data import Tokenizer
from legato.errors import CheckpointError, LegatoError
from legato.models import Transformer, build_model
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict
from legato.train import checkpoint as ckpt
from legato.train.config import TrainConfig
from legato.train.run_data import run_tokenizer


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
    """The model of ``path``'s checkpoint with the weights it was saved with."""
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
