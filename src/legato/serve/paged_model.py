"""One engine step of a frozen backbone: many requests' new tokens, each with its adapter,
attending over a paged KV cache.

``Transformer.forward`` takes a rectangular batch and recomputes every position; serving
needs each request's *new* tokens only (a prompt chunk, or one decode token), attending to
the keys and values it cached in earlier steps. So this walks the same modules as the
training model (norms, projections, RoPE, ``activate``, grouped SDPA) over a flat layout:
all requests' new tokens are concatenated into ``[T, h]`` rows, every linear layer runs
once over all rows, and each adapter's LoRA is added on its requests' rows through the
segmented GEMM of ``lora/segmented.py`` (Punica's SGMV shape). Only attention runs per
request: its new keys and values are written into its cache blocks, and its queries attend
to all of its cached positions up to their own.

The cache is one tensor ``[blocks, layers, 2, block_size, kv_heads, head_dim]``; which
request may write which block is ``blocks.BlockManager``'s business. Dense attention
models (Llama, Qwen3, GPT styles) are served; MoE and MLA backbones are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.lora.adapter import LoraAdapter
from legato.lora.packed_model import check_supported
from legato.lora.segmented import Segment, lora_forward
from legato.models.attention import grouped_sdpa
from legato.models.mlp import activate
from legato.models.rope import apply_rope
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
    """Each adapter's LoRA on its requests' rows (consecutive requests of one adapter form
    one segment)."""

    def __init__(self, parts: Sequence[StepRows]) -> None:
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

    def linear(self, x: Tensor, path: str, layer: nn.Linear) -> Tensor:
        y = F.linear(x, layer.weight, layer.bias)
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


class PagedModel:
    """``step(parts)``: the next-token logits of each part's last new token."""

    def __init__(self, model: Transformer, cache: PagedKVCache) -> None:
        check_supported(model, "--model", "serving")
        self.model = model.eval().requires_grad_(False)
        self.cache = cache

    @torch.inference_mode()
    def step(self, parts: Sequence[StepRows]) -> Tensor:
        """Logits [len(parts), vocab] (float32) after each part's last token."""
        decoder = self.model.model
        device = self.model.output_weight().device
        lora = _Lora(parts)
        ids = torch.tensor([t for p in parts for t in p.tokens], device=device)
        positions = torch.cat(
            [torch.arange(p.start, p.start + len(p.tokens), device=device) for p in parts]
        )
        x = decoder.embed_tokens(ids)
        rope = None
        if decoder.embed_positions is not None:
            x = x + decoder.embed_positions(positions)
        else:
            cos, sin = decoder.rotary_emb(positions[None])
            rope = (cos, sin)
        sizes = [len(p.tokens) for p in parts]
        for i, block in enumerate(decoder.layers):
            prefix = f"model.layers.{i}"
            x = x + self._attention(
                i, block.self_attn, block.input_layernorm(x), prefix, parts, sizes, lora, rope
            )
            h = block.post_attention_layernorm(x)
            mlp, path = block.mlp, f"{prefix}.mlp"
            gate = lora.linear(h, f"{path}.gate_proj", mlp.gate_proj) if mlp.gate_proj else None
            up = lora.linear(h, f"{path}.up_proj", mlp.up_proj)
            x = x + lora.linear(activate(up, gate), f"{path}.down_proj", mlp.down_proj)
        last = torch.tensor(sizes, device=device).cumsum(0) - 1
        hidden = decoder.norm(x[last])
        if self.model.lm_head is None:
            return F.linear(hidden, self.model.output_weight()).float()
        return _Lora(_last_rows(parts)).linear(hidden, "lm_head", self.model.lm_head).float()

    def _attention(self, layer, attn, x, prefix, parts, sizes, lora, rope) -> Tensor:
        path = f"{prefix}.self_attn"
        t = x.shape[0]
        q = lora.linear(x, f"{path}.q_proj", attn.q_proj).view(t, attn.num_heads, attn.head_dim)
        k = lora.linear(x, f"{path}.k_proj", attn.k_proj).view(t, attn.num_kv_heads, attn.head_dim)
        v = lora.linear(x, f"{path}.v_proj", attn.v_proj).view(t, attn.num_kv_heads, attn.head_dim)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:  # apply_rope takes [B, H, S, D]
            q = apply_rope(q.transpose(0, 1)[None], *rope)[0].transpose(0, 1)
            k = apply_rope(k.transpose(0, 1)[None], *rope)[0].transpose(0, 1)
        outs = []
        for part, qs, ks, vs in zip(
            parts, q.split(sizes), k.split(sizes), v.split(sizes), strict=True
        ):
            self.cache.write(layer, part, ks, vs)
            length = part.start + len(part.tokens)
            keys, values = self.cache.read(layer, part.blocks, length)
            query_pos = torch.arange(part.start, length, device=x.device)[:, None]
            mask = torch.arange(length, device=x.device)[None, :] <= query_pos
            out = grouped_sdpa(
                qs.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                mask, is_causal=False,
            )  # fmt: skip
            outs.append(out[0].transpose(0, 1).reshape(len(part.tokens), -1))
        return lora.linear(torch.cat(outs), f"{path}.o_proj", attn.o_proj)


def _last_rows(parts: Sequence[StepRows]) -> list[StepRows]:
    """One row per part (its last token), for the LM head's LoRA."""
    return [StepRows(p.tokens[-1:], 0, (), p.adapter) for p in parts]
