"""One engine step of a frozen backbone: many requests' new tokens, each with its adapter,
attending over a paged KV cache.

``Transformer.forward`` takes a rectangular batch and recomputes every position; serving
needs each request's *new* tokens only (a prompt chunk, or one decode token), attending to
the keys and values it cached in earlier steps. So the decoder runs over a flat layout
(``Decoder.forward`` with this module's backends): all requests' new tokens are
concatenated into ``[T, h]`` rows, every linear layer runs once over all rows, and each
adapter's LoRA is added on its requests' rows through the segmented GEMM of
``lora/segmented.py`` (Punica's SGMV shape; the linear backend). Only attention runs per
request (the attention backend): its new keys and values are written into its cache
blocks, and its queries attend to all of its cached positions up to their own.

The cache is one tensor ``[blocks, layers, 2, block_size, kv_heads, head_dim]``; which
request may write which block is ``blocks.BlockManager``'s business. Dense and MoE models
are served (LoRA on the layers ``adapter.linear_layers`` names); MLA backbones are
refused: their keys and values differ in width, which this cache does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.errors import ConfigError
from legato.lora.adapter import LoraAdapter
from legato.lora.segmented import Segment, lora_forward
from legato.models.attention import grouped_sdpa, visible
from legato.models.transformer import Transformer


@dataclass
class StepRows:
    """One request's part of a step: ``tokens`` at positions ``start..``, its block table
    (covering them) and its adapter (None = the base model)."""

    tokens: Sequence[int]
    start: int
    blocks: Sequence[int]
    adapter: LoraAdapter | None


class PagedKVCache:
    """Keys and values of every layer, in blocks of ``block_size`` positions."""

    def __init__(self, model: Transformer, num_blocks: int, block_size: int) -> None:
        spec = model.spec
        weight = model.output_weight()
        self.block_size = block_size
        self.kv = torch.zeros(
            num_blocks, spec.num_layers, 2, block_size, spec.num_kv_heads, spec.head_dim,
            dtype=weight.dtype, device=weight.device,
        )  # fmt: skip

    @property
    def bytes_per_block(self) -> int:
        return self.kv[0].numel() * self.kv.element_size()

    @staticmethod
    def block_bytes(model: Transformer, block_size: int) -> int:
        """Bytes of one block (every layer's keys and values of ``block_size`` positions)."""
        spec, weight = model.spec, model.output_weight()
        elements = spec.num_layers * 2 * block_size * spec.num_kv_heads * spec.head_dim
        return elements * weight.element_size()

    def write(self, layer: int, rows: StepRows, k: Tensor, v: Tensor) -> None:
        """Store ``k``/``v`` [n, kv_heads, D] of positions ``rows.start ..``."""
        positions = torch.arange(rows.start, rows.start + k.shape[0], device=k.device)
        table = torch.as_tensor(rows.blocks, device=k.device)
        block, offset = table[positions // self.block_size], positions % self.block_size
        self.kv[block, layer, 0, offset] = k
        self.kv[block, layer, 1, offset] = v

    def read(self, layer: int, blocks: Sequence[int], length: int) -> tuple[Tensor, Tensor]:
        """Keys and values [length, kv_heads, D] of positions 0 .. length - 1."""
        used = self.kv[torch.as_tensor(blocks[: -(-length // self.block_size)]), layer]
        flat = used.transpose(0, 1).reshape(2, -1, *used.shape[-2:])
        return flat[0, :length], flat[1, :length]


class _Lora:
    """The linear backend: each adapter's LoRA on its requests' rows (consecutive
    requests of one adapter form one segment)."""

    def __init__(self, parts: Sequence[StepRows], paths: dict[nn.Module, str]) -> None:
        self.paths = paths
        self.groups: list[tuple[LoraAdapter, int, int]] = []
        start = 0
        for part in parts:
            stop = start + len(part.tokens)
            if part.adapter is not None:
                if (
                    self.groups
                    and self.groups[-1][0] is part.adapter
                    and self.groups[-1][2] == start
                ):
                    self.groups[-1] = (part.adapter, self.groups[-1][1], stop)
                else:
                    self.groups.append((part.adapter, start, stop))
            start = stop

    def __call__(self, layer: nn.Module, x: Tensor) -> Tensor:
        y = F.linear(x, layer.weight, layer.bias)
        path = self.paths[layer]
        segments, a_mats, b_mats = [], [], []
        for adapter, start, stop in self.groups:
            found = adapter.factors(path)
            if found is not None:
                segments.append(Segment(start, stop, adapter.shape.scale))
                a_mats.append(found[0])
                b_mats.append(found[1])
        if segments:
            lora_forward(x, y, segments, a_mats, b_mats, "loop")
        return y


@dataclass(frozen=True)
class _PagedAttention:
    """The attention backend: each request's new keys and values written into its blocks,
    its queries attending to all of its cached positions up to their own."""

    cache: PagedKVCache
    parts: Sequence[StepRows]

    def __call__(self, module: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [H, T, D], k/v [Hkv, T, D] -> [H, T, D]."""
        sizes = [len(part.tokens) for part in self.parts]
        outs = []
        for part, qs, ks, vs in zip(
            self.parts, q.split(sizes, -2), k.split(sizes, -2), v.split(sizes, -2), strict=True
        ):
            self.cache.write(module.layer_index, part, ks.transpose(0, 1), vs.transpose(0, 1))
            length = part.start + len(part.tokens)
            keys, values = self.cache.read(module.layer_index, part.blocks, length)
            positions = torch.arange(part.start, length, device=q.device)
            mask = visible(positions, length, module.sliding_window)
            out = grouped_sdpa(
                qs[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask,
                is_causal=False,
            )  # fmt: skip
            outs.append(out[0])
        return torch.cat(outs, dim=-2)


class PagedModel:
    """``step(parts)``: the next-token logits of each part's last new token."""

    def __init__(self, model: Transformer, cache: PagedKVCache) -> None:
        if model.spec.mla is not None:
            raise ConfigError(
                f"--model: serving supports attention with one key/value width; "
                f"{model.spec.name!r} uses MLA"
            )
        self.model = model.eval().requires_grad_(False)
        self.cache = cache
        self._paths = {module: path for path, module in model.named_modules()}

    @torch.inference_mode()
    def step(self, parts: Sequence[StepRows]) -> Tensor:
        """Logits [len(parts), vocab] (float32) after each part's last token."""
        device = self.model.output_weight().device
        ids = torch.tensor([t for p in parts for t in p.tokens], device=device)
        positions = torch.cat(
            [torch.arange(p.start, p.start + len(p.tokens), device=device) for p in parts]
        )
        hidden = self.model.model(
            ids,
            positions,
            attention=_PagedAttention(self.cache, parts),
            linear=_Lora(parts, self._paths),
        )
        last = torch.tensor([len(p.tokens) for p in parts], device=device).cumsum(0) - 1
        hidden = hidden[last]
        if self.model.lm_head is None:
            return F.linear(hidden, self.model.output_weight()).float()
        return _Lora(_last_rows(parts), self._paths)(self.model.lm_head, hidden).float()


def _last_rows(parts: Sequence[StepRows]) -> list[StepRows]:
    """One row per part (its last token), for the LM head's LoRA."""
    return [StepRows(p.tokens[-1:], 0, (), p.adapter) for p in parts]
