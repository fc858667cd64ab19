"""What a server serves: a base model and its LoRA adapters, from wherever they were made.

A model is a ``legato train`` run directory (or one of its checkpoints: spec, weights and
tokenizer come from it), a Hugging Face model folder (spec from ``config.json``, weights from
its safetensors, tokenizer from ``tokenizer.json`` unless ``--tokenizer``), or a preset name or ModelSpec TOML with random weights, or either
with Hugging Face-named safetensors (``--weights``). Adapters are PEFT folders — what ``legato
finetune`` writes and what HF PEFT's ``save_pretrained`` writes — or folders of them; with
none given, ``generated_adapters`` makes a few random ones so ``legato serve`` runs on a
fresh machine — and only on random weights (``random_weights``): next to a real model they
would be noise that ``/v1/models`` lists as if it were trained.
"""

from __future__ import annotations

from pathlib import Path

import torch

from legato.data.tokenizer import Tokenizer, load_tokenizer
from legato.errors import CheckpointError, SpecError
from legato.lora.adapter import AdapterShape, LoraAdapter
from legato.lora.peft_io import CONFIG_FILE, load_adapter
from legato.models import Transformer, build_model
from legato.models.hf_checkpoint import load_safetensors
from legato.models.hf_folder import is_hf_folder
from legato.specs.registry import load_model
from legato.train.trained_model import is_legato_run, load_hf_folder, load_trained

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def load_served_model(
    model: str, weights: str | None = None, tokenizer: str | None = None, seed: int = 0
) -> tuple[Transformer, Tokenizer, str]:
    """(model, tokenizer, the name clients call the base model by)."""
    path = Path(model).expanduser()
    if path.is_dir() and is_legato_run(path):
        if weights or tokenizer:
            raise CheckpointError(
                "--weights/--tokenizer: a legato run brings its own weights and tokenizer"
            )
        trained = load_trained(path, "--model")
        return trained.model, trained.tokenizer, path.name
    if path.is_dir() and is_hf_folder(path):
        if weights:
            raise CheckpointError(
                f"--weights: must be left out when --model is a Hugging Face folder ({path}); "
                "the weights come from its safetensors"
            )
        folder = load_hf_folder(path, "--model", tokenizer=tokenizer)
        return folder.model, folder.tokenizer, path.name
    if path.is_dir():
        raise CheckpointError(
            f"--model: {path} is a folder but neither a legato run (no checkpoints/latest) "
            "nor a Hugging Face model folder (no config.json); --model takes either, a "
            "preset name or a ModelSpec TOML"
        )
    served = load_tokenizer(tokenizer or "byte", where="--tokenizer", trains=False)
    try:
        spec = load_model(model)
    except SpecError as exc:
        raise SpecError(f"--model: {exc}") from None
    built = build_model(spec, seed=seed, device="cpu")
    if weights:
        try:
            load_safetensors(built, weights)
        except CheckpointError as exc:
            raise CheckpointError(f"--weights: {exc}") from None
    return built.eval(), served, built.spec.name


def random_weights(model: str, weights: str | None = None) -> bool:
    """Whether ``load_served_model(model, weights)`` draws the weights at random (a preset
    without ``--weights``, not a run directory or a Hugging Face folder)."""
    path = Path(model).expanduser()
    return not weights and not (path.is_dir() and (is_legato_run(path) or is_hf_folder(path)))


def adapter_folders(paths: list[str], flag: str = "--adapters") -> dict[str, Path]:
    """Every PEFT folder in ``paths`` (a folder with ``adapter_config.json``, or a folder
    holding such folders), by name (its folder's); ``flag`` names the argument in errors."""
    found: dict[str, Path] = {}
    for given in paths:
        root = Path(given).expanduser()
        folders = [root] if (root / CONFIG_FILE).is_file() else sorted(
            p for p in root.iterdir() if (p / CONFIG_FILE).is_file()
        ) if root.is_dir() else []  # fmt: skip
        if not folders:
            raise CheckpointError(
                f"{flag}: {root} is not a PEFT adapter folder ({CONFIG_FILE}) or a folder of them"
            )
        for folder in folders:
            if folder.name in found:
                raise CheckpointError(f"{flag}: two adapters named {folder.name!r}")
            found[folder.name] = folder
    return found


def load_adapters(
    paths: list[str], model: Transformer, flag: str = "--adapters"
) -> dict[str, LoraAdapter]:
    """The adapters of ``adapter_folders(paths)``, loaded onto ``model``."""
    return {name: load_adapter(folder, model).eval()
            for name, folder in adapter_folders(paths, flag).items()}  # fmt: skip


def generated_adapters(
    model: Transformer, count: int = 4, rank: int = 8, seed: int = 0
) -> dict[str, LoraAdapter]:
    """``count`` random rank-``rank`` adapters (``lora-0`` ...), with both factors drawn so
    each visibly changes the model's answers (a trained B is never zero either)."""
    adapters = {}
    shape = AdapterShape(rank=rank, alpha=2.0 * rank, dropout=0.0, target_modules=DEFAULT_TARGETS)
    for i in range(count):
        adapter = LoraAdapter(f"lora-{i}", shape, model, seed=seed + i)
        generator = torch.Generator().manual_seed(seed + 1000 + i)
        with torch.no_grad():
            for _, _, b in adapter.named_factors():
                b.copy_(torch.randn(b.shape, generator=generator) * 0.02)
        adapters[adapter.name] = adapter.eval()
    return adapters
