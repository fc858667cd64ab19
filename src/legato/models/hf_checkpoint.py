"""Hugging Face checkpoint names and safetensors files for :class:`Transformer`.

Our ``state_dict`` keys already are HF keys except for the stacked MoE experts, which HF
stores one tensor per expert. Two HF naming flavours (``hf_style``) exist for MoE layers:

* ``"qwen"`` (Qwen3-MoE, DeepSeek-V2/V3): ``mlp.gate.weight``,
  ``mlp.experts.{j}.{gate,up,down}_proj.weight``, ``mlp.shared_experts.*``,
  ``mlp.gate.e_score_correction_bias``;
* ``"mixtral"``: ``block_sparse_moe.gate.weight``,
  ``block_sparse_moe.experts.{j}.{w1,w3,w2}.weight`` (w1 = gate, w3 = up, w2 = down).

Stacked expert biases (``bias=True`` specs) map to ``experts.{j}.<name>.bias``.

The default is ``"mixtral"`` when the spec name starts with "mixtral", else ``"qwen"``.
Dense models are identical in both. Files are written like ``save_pretrained``: one
``model.safetensors``, or shards plus ``model.safetensors.index.json`` above a size.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from legato.atomic import write_atomic
from legato.errors import CheckpointError
from legato.models.transformer import Transformer
from legato.specs.hf_config import HFStyle

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # HF's default max_shard_size="5GB"

_MIXTRAL_EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_STACKED = re.compile(
    r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_proj|up_proj|down_proj)(_bias)?$"
)
_MOE_PREFIX = re.compile(r"^(model\.layers\.\d+)\.mlp\.(gate|experts|shared_experts)\.")
_SHARD_NAME = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def default_hf_style(model: Transformer) -> HFStyle:
    return "mixtral" if model.spec.name.lower().startswith("mixtral") else "qwen"


def hf_entries(model: Transformer, style: HFStyle | None) -> list[tuple[str, str, int | None]]:
    """(HF key, our key, expert index or None) for every tensor of the model's state."""
    style = style or default_hf_style(model)
    if style not in ("qwen", "mixtral"):
        raise CheckpointError(f"hf_style must be 'qwen' or 'mixtral', got {style!r}")
    entries = []
    for key, tensor in model.state_dict().items():
        hf_key = key
        if style == "mixtral":
            if ".mlp.shared_experts." in key:
                raise CheckpointError(f"hf_style 'mixtral' has no shared experts ({key})")
            hf_key = _MOE_PREFIX.sub(r"\1.block_sparse_moe.\2.", key)
        stacked = _STACKED.match(key)
        if stacked is None:
            entries.append((hf_key, key, None))
            continue
        layer, name, is_bias = stacked.groups()
        block = "block_sparse_moe" if style == "mixtral" else "mlp"
        hf_name = _MIXTRAL_EXPERT_NAMES[name] if style == "mixtral" else name
        kind = "bias" if is_bias else "weight"
        for j in range(tensor.shape[0]):
            entries.append((f"{layer}.{block}.experts.{j}.{hf_name}.{kind}", key, j))
    return entries


def to_hf_state_dict(model: Transformer, hf_style: HFStyle | None = None) -> dict[str, Tensor]:
    """The model's tensors under HF names (per-expert tensors are views of the stacks)."""
    state = model.state_dict()
    return {
        hf_key: state[key] if j is None else state[key][j]
        for hf_key, key, j in hf_entries(model, hf_style)
    }


def _first_problem(kind: str, keys: list[str]) -> str:
    return f"{len(keys)} {kind} key(s), first {keys[0]!r}"


def check_keys(
    model: Transformer, entries: list[tuple[str, str, int | None]], found: Mapping
) -> None:
    """A CheckpointError naming the first missing, unexpected or wrongly shaped key when
    ``found`` (HF key -> shape) does not hold exactly the (global) shapes of ``entries``."""
    ours = model.state_dict()
    expected = {
        hf_key: tuple(ours[key].shape if j is None else ours[key].shape[1:])
        for hf_key, key, j in entries
    }
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    mismatched = [
        f"{k} {tuple(found[k])} vs model {shape}"
        for k, shape in expected.items()
        if k in found and tuple(found[k]) != shape
    ]
    problems = [
        _first_problem(kind, keys)
        for kind, keys in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mismatched", mismatched),
        )
        if keys
    ]
    if problems:
        raise CheckpointError(
            f"checkpoint does not match model {model.spec.name!r}: " + "; ".join(problems)
        )


@torch.no_grad()
def load_hf_state_dict(
    model: Transformer, state: Mapping[str, Tensor], hf_style: HFStyle | None = None
) -> None:
    """Copy HF-named tensors into the model; any missing, unexpected or wrongly shaped key
    raises :class:`CheckpointError` before anything is changed."""
    entries = hf_entries(model, hf_style)
    ours = model.state_dict()
    check_keys(model, entries, {k: t.shape for k, t in state.items()})
    for hf_key, key, j in entries:
        target = ours[key] if j is None else ours[key][j]
        target.copy_(state[hf_key])


def _shards(state: dict[str, Tensor], max_bytes: int) -> list[list[str]]:
    """Greedy split of keys, in order, into groups of at most ``max_bytes`` (a larger single
    tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def save_safetensors(
    model: Transformer,
    directory: str | os.PathLike,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    hf_style: HFStyle | None = None,
) -> list[Path]:
    """Write the model under HF names into ``directory``; returns the files written.

    Files of an older save that the new one does not use (a stale index or shard) are
    removed, so the folder always describes exactly this model.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    state = to_hf_state_dict(model, hf_style)
    groups = _shards(state, max_shard_bytes)
    if len(groups) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    written = []
    for name, keys in zip(names, groups, strict=True):
        # Copies: per-expert views share storage, which safetensors refuses to write.
        tensors = {k: state[k].detach().to("cpu", copy=True).contiguous() for k in keys}
        write_atomic(folder / name, lambda p, t=tensors: save_file(t, p, metadata={"format": "pt"}))
        written.append(folder / name)
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
            "weight_map": {k: name for name, keys in zip(names, groups, strict=True) for k in keys},
        }
        write_atomic(folder / INDEX_FILE, lambda p: p.write_text(json.dumps(index, indent=2)))
        written.append(folder / INDEX_FILE)
    for stale in folder.iterdir():
        is_ours = stale.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_NAME.match(stale.name)
        if is_ours and stale not in written:
            stale.unlink()
    return written


def _checkpoint_files(path: Path) -> list[Path]:
    if path.is_dir():
        if (path / INDEX_FILE).exists():
            path = path / INDEX_FILE
        elif (path / SINGLE_FILE).exists():
            return [path / SINGLE_FILE]
        else:
            raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.name.endswith(".index.json"):
        return [path]
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot read index {path}: {exc}") from None
    return [path.parent / name for name in sorted(set(weight_map.values()))]


def load_safetensors(
    model: Transformer, path: str | os.PathLike, *, hf_style: HFStyle | None = None
) -> None:
    """Load a ``.safetensors`` file, an HF index file, or a folder holding either."""
    state: dict[str, Tensor] = {}
    for file in _checkpoint_files(Path(path)):
        try:
            state.update(load_file(file))
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"cannot read {file}: {exc}") from None
    load_hf_state_dict(model, state, hf_style)
