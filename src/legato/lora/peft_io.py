"""Adapters on disk in Hugging Face PEFT's format, so PEFT and vLLM-style servers load them.

A folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` with the keys PEFT
writes for a ``LlamaForCausalLM``:
``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` ([r, in]) and
``...lora_B.weight`` ([out, r]). Our module paths already are HF paths, so a key is the
path with PEFT's wrapper prefix. A save is atomic for the folder as a whole: both files are
written into a fresh sibling folder which then replaces the old one, so a crash never
leaves a new weights file next to an old config.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from legato.errors import CheckpointError, ConfigError
from legato.lora.adapter import AdapterShape, LoraAdapter

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."


def peft_key(path: str, factor: str) -> str:
    return f"{_PREFIX}{path}.lora_{factor}.weight"


def peft_config(shape: AdapterShape, base_model: str) -> dict:
    """The ``adapter_config.json`` of a plain LoRA adapter (fields as PEFT writes them)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": shape.rank,
        "lora_alpha": shape.alpha,
        "lora_dropout": shape.dropout,
        "target_modules": sorted(shape.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def _readable(staging: Path) -> None:
    """Give the staged folder and files the permissions a plain mkdir/open would have."""
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    for file in staging.iterdir():
        file.chmod(0o666 & ~umask)


def save_adapter(adapter: LoraAdapter, directory: str | os.PathLike, base_model: str) -> Path:
    """Write ``adapter`` as a PEFT folder at ``directory`` (replacing any older one)."""
    folder = Path(directory)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, a, b in adapter.named_factors():
        tensors[peft_key(path, "A")] = a.detach().to("cpu", torch.float32).contiguous()
        tensors[peft_key(path, "B")] = b.detach().to("cpu", torch.float32).contiguous()
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    old = folder.parent / f"{staging.name}.old"
    try:
        save_file(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt"})
        config = json.dumps(peft_config(adapter.shape, base_model), indent=2)
        (staging / CONFIG_FILE).write_text(config + "\n", encoding="utf-8")
        _readable(staging)
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
    except BaseException:
        if old.exists() and not folder.exists():
            old.rename(folder)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _read_config(folder: Path) -> AdapterShape:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder / CONFIG_FILE}: cannot read ({exc})") from None
    where = folder / CONFIG_FILE
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{where}: peft_type must be 'LORA', got {config.get('peft_type')!r}")
    for key in ("use_dora", "use_rslora", "fan_in_fan_out"):
        if config.get(key):
            raise CheckpointError(f"{where}: {key} = true is not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise CheckpointError(f"{where}: per-layer {key} is not supported")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not targets:
        raise CheckpointError(f"{where}: target_modules must be a list of layer names")
    return AdapterShape(
        int(config["r"]), float(config["lora_alpha"]), float(config.get("lora_dropout", 0.0)),
        tuple(targets),
    )  # fmt: skip


def load_adapter(
    directory: str | os.PathLike, model: nn.Module, name: str | None = None
) -> LoraAdapter:
    """Read a PEFT LoRA folder into a :class:`LoraAdapter` for ``model``; any missing,
    unexpected or wrongly shaped tensor is a :class:`CheckpointError`."""
    folder = Path(directory)
    if not folder.is_dir():
        raise CheckpointError(f"adapter folder {folder} does not exist")
    shape = _read_config(folder)
    device = next(model.parameters()).device
    try:
        adapter = LoraAdapter(
            name or folder.name, shape, model, where=str(folder / CONFIG_FILE), device=device
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        state = load_file(folder / WEIGHTS_FILE)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {folder / WEIGHTS_FILE}: {exc}") from None
    expected = {}
    for path, a, b in adapter.named_factors():
        expected[peft_key(path, "A")] = a
        expected[peft_key(path, "B")] = b
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        first = missing[0] if missing else unexpected[0]
        kind = "missing" if missing else "unexpected"
        raise CheckpointError(f"{folder / WEIGHTS_FILE}: {kind} tensor {first!r}")
    with torch.no_grad():
        for key, param in expected.items():
            if state[key].shape != param.shape:
                raise CheckpointError(
                    f"{folder / WEIGHTS_FILE}: {key} has shape {tuple(state[key].shape)}, "
                    f"the model needs {tuple(param.shape)}"
                )
            param.copy_(state[key])
    return adapter
