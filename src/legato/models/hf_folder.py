"""Weights of a Hugging Face model folder into a (possibly sharded) :class:`Transformer`.

The spec comes from ``config.json`` (``specs.hf_config.read_spec``), the weights from
``model.safetensors`` or the shards ``model.safetensors.index.json`` lists, under the names
of ``hf_checkpoint`` (Mixtral or Qwen expert names by the folder's architecture). Each
parameter reads only what this process holds, with ``safe_open(...).get_slice``: a plain
tensor the whole of it, a DTensor (FSDP2's Shard(0), TP's Shard(0)/Shard(1), EP's experts)
its local block, a stacked expert tensor only the experts and rows it holds, one
per-expert tensor at a time; so a 70B folder never sits whole in one process's memory.
Values are cast to the model's dtype (a bf16 folder into fp32 masters).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from legato.errors import CheckpointError
from legato.models.hf_checkpoint import INDEX_FILE, SINGLE_FILE, check_keys, hf_entries
from legato.models.transformer import Transformer
from legato.specs.hf_config import FAMILIES, architecture_of, is_hf_folder, read_config, read_spec

__all__ = ["is_hf_folder", "load_weights", "read_spec"]  # the folder's spec: specs.hf_config


def _weight_map(folder: Path) -> dict[str, Path]:
    """HF key -> the file holding it."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            names = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read index {index}: {exc}") from None
        return {key: folder / name for key, name in names.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    with _open(single) as handle:
        return dict.fromkeys(handle.keys(), single)


def _open(file: Path):
    try:
        return safe_open(file, framework="pt")
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from None


class _Files:
    """Open safetensors handles, one per file, for the duration of a load."""

    def __init__(self, weight_map: dict[str, Path], stack: ExitStack) -> None:
        self.weight_map = weight_map
        self._stack = stack
        self._handles: dict[Path, object] = {}

    def slice(self, key: str):
        file = self.weight_map[key]
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(_open(file))
        return self._handles[file].get_slice(key)

    def shapes(self) -> Iterator[tuple[str, list[int]]]:
        for key in self.weight_map:
            yield key, self.slice(key).get_shape()


def _local_block(param: Tensor) -> tuple[Tensor, tuple[slice, ...] | None]:
    """(the tensor this process writes, the block of the global tensor it holds), or a
    None block when the layout is not one contiguous block (a strided shard)."""
    if not isinstance(param, DTensor):
        return param, tuple(slice(0, n) for n in param.shape)
    local = param.to_local()
    if not all(type(p) is Shard or isinstance(p, Replicate) for p in param.placements):
        return local, None
    shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    return local, tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def _read(files: _Files, param: Tensor, keys: list[str], stacked: bool) -> None:
    """Fill this process's part of ``param`` from ``keys`` (one key, or one per expert)."""
    local, block = _local_block(param)
    if block is None:  # rare layouts: read the whole tensor, keep this rank's part
        full = [files.slice(k)[:] for k in keys]
        whole = torch.stack(full) if stacked else full[0]
        local.copy_(
            distribute_tensor(
                whole, param.device_mesh, param.placements, src_data_rank=None
            ).to_local()
        )
        return
    if not stacked:
        local.copy_(files.slice(keys[0])[block])
        return
    experts, rows = block[0], block[1:]
    for i, j in enumerate(range(experts.start, experts.stop)):
        local[i].copy_(files.slice(keys[j])[rows])


@torch.no_grad()
def load_weights(
    model: Transformer, folder: str | os.PathLike, *, only: Collection[str] | None = None
) -> None:
    """Load the folder's safetensors into ``model`` (plain, FSDP2-, TP- or EP-sharded),
    each process reading only the slices it holds. ``only``: the FQNs to load (a pipeline
    rank's stages), the rest untouched. Keys are checked against the whole model first:
    a missing, unexpected or wrongly shaped one is a CheckpointError naming the first."""
    folder = Path(folder).expanduser()
    style = FAMILIES[architecture_of(read_config(folder))].hf_style
    entries = hf_entries(model, style)
    with ExitStack() as stack:
        files = _Files(_weight_map(folder), stack)
        check_keys(model, entries, dict(files.shapes()))
        state = model.state_dict()
        by_param: dict[str, list[str]] = {}
        stacked = {key for _, key, j in entries if j is not None}
        for hf_key, key, _ in entries:
            by_param.setdefault(key, []).append(hf_key)
        for key, hf_keys in by_param.items():
            if only is None or key in only:
                _read(files, state[key], hf_keys, key in stacked)
