"""The frozen backbone run over several tasks' tokens at once, each with its own adapter.

``Transformer.forward`` takes one rectangular ``[B, S]`` batch; fused multi-task training
needs tasks of different sequence lengths in one pass. So this module walks the same
modules (norms, projections, RoPE, ``attend``, ``activate``) over a flat token layout:
every task's ``[n_i, L_i]`` sequences are flattened and concatenated into ``[T, h]`` rows,
every linear layer runs once over all rows through :func:`fused_lora_linear`, and only
attention, which has no weights to share, runs per task on its own ``[n_i, L_i]`` view.
With a single task this *is* legato's single-task LoRA path, so fused and single-task
training execute the same code and differ only in how many rows each GEMM sees.

Dense attention models are supported (Llama, Qwen3, GPT styles); MoE and MLA backbones
raise a ConfigError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.errors import ConfigError
from legato.lora.adapter import LoraAdapter
from legato.lora.fused_linear import Segment, fused_lora_linear
from legato.lora.segmented import Backend
from legato.lora.task_data import IGNORE, Sequences
from legato.models.attention import attend
from legato.models.mlp import activate
from legato.models.rope import apply_rope
from legato.models.transformer import Transformer


@dataclass(frozen=True)
class TaskRows:
    """One task's part of a fused step: its adapter (None = base model only) and sequences."""

    task: str
    adapter: LoraAdapter | None
    sequences: Sequences


class _Layout:
    """Where each task's rows sit in the packed ``[T, h]`` activations.

    Per-task views are taken with ``split`` rather than slicing: the backward of a slice
    allocates a zero tensor of the full packed size, which for k tasks costs k times the
    activation, while the backward of a split is one concatenation.
    """

    def __init__(self, parts: Sequence[TaskRows], training: bool, backend: Backend) -> None:
        self.parts = list(parts)
        self.sizes = [part.sequences.num_tokens for part in self.parts]
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for size in self.sizes:
            self.bounds.append((start, start + size))
            start += size
        self.training = training
        self.backend = backend

    def linear(self, x: Tensor, path: str, layer: nn.Linear) -> Tensor:
        """``layer`` over all rows, plus each task's LoRA on its rows if it targets ``path``."""
        segments, factors, drops = [], [], {}
        for i, (part, (start, stop)) in enumerate(zip(self.parts, self.bounds, strict=True)):
            found = part.adapter.factors(path) if part.adapter is not None else None
            if found is None:
                continue
            segments.append(Segment(start, stop, part.adapter.shape.scale))
            factors.append(found)
            if self.training and part.adapter.shape.dropout > 0:
                drops[i] = part.adapter
        x_lora = self._dropped(x, drops) if drops else None
        return fused_lora_linear(
            x, layer.weight, layer.bias, segments, factors, x_lora=x_lora, backend=self.backend
        )

    def _dropped(self, x: Tensor, drops: dict[int, LoraAdapter]) -> Tensor:
        """``x`` with LoRA dropout on the rows of the tasks in ``drops``, each from its own
        generator, so a task's masks do not depend on the tasks fused with it."""
        pieces = list(x.split(self.sizes))
        for i, adapter in drops.items():
            p = adapter.shape.dropout
            keep = torch.empty_like(pieces[i]).bernoulli_(
                1 - p, generator=adapter.dropout_generator
            )
            pieces[i] = pieces[i] * keep / (1 - p)
        return torch.cat(pieces)


def check_supported(model: Transformer, field: str = "base", use: str = "LoRA fine-tuning") -> None:
    """The flat-layout walkers (this one and serving's) cover dense attention only."""
    spec = model.spec
    if spec.moe is not None or spec.mla is not None:
        kind = "MoE" if spec.moe is not None else "MLA"
        raise ConfigError(
            f"{field}: {use} supports dense attention models; {spec.name!r} is {kind}"
        )


class MultiLoraModel(nn.Module):
    """A frozen :class:`Transformer` that computes per-task losses for packed task rows."""

    def __init__(
        self, base: Transformer, backend: Backend = "auto", head_chunk_tokens: int = 1024
    ) -> None:
        super().__init__()
        check_supported(base)
        self.base = base.requires_grad_(False).eval()
        self.backend = backend
        self.head_chunk_tokens = head_chunk_tokens

    def hidden_states(self, parts: Sequence[TaskRows]) -> tuple[Tensor, _Layout]:
        """Final-normed hidden states [T, h] of all tasks' rows, packed in order."""
        layout = _Layout(parts, self.training and torch.is_grad_enabled(), self.backend)
        decoder = self.base.model
        ids = torch.cat([p.sequences.input_ids.reshape(-1) for p in parts])
        x = decoder.embed_tokens(ids)
        if decoder.embed_positions is not None:
            pos = torch.cat([p.sequences.position_ids.reshape(-1) for p in parts])
            x = x + decoder.embed_positions(pos)
        ropes = [
            decoder.rotary_emb(p.sequences.position_ids) if decoder.rotary_emb else None
            for p in parts
        ]
        for i, block in enumerate(decoder.layers):
            prefix = f"model.layers.{i}"
            x = x + self._attention(
                block.self_attn, block.input_layernorm(x), prefix, layout, ropes
            )
            h = block.post_attention_layernorm(x)
            mlp, mp = block.mlp, f"{prefix}.mlp"
            gate = layout.linear(h, f"{mp}.gate_proj", mlp.gate_proj) if mlp.gate_proj else None
            up = layout.linear(h, f"{mp}.up_proj", mlp.up_proj)
            x = x + layout.linear(activate(up, gate), f"{mp}.down_proj", mlp.down_proj)
        return decoder.norm(x), layout

    def _attention(self, attn, x: Tensor, prefix: str, layout: _Layout, ropes) -> Tensor:
        p = f"{prefix}.self_attn"
        q = layout.linear(x, f"{p}.q_proj", attn.q_proj)
        k = layout.linear(x, f"{p}.k_proj", attn.k_proj)
        v = layout.linear(x, f"{p}.v_proj", attn.v_proj)
        outs = []
        per_task = zip(
            layout.parts,
            q.split(layout.sizes),
            k.split(layout.sizes),
            v.split(layout.sizes),
            ropes,
            strict=True,
        )
        for part, qs, ks, vs, rope in per_task:
            n, length = part.sequences.input_ids.shape
            qs = qs.view(n, length, attn.num_heads, attn.head_dim)
            ks = ks.view(n, length, attn.num_kv_heads, attn.head_dim)
            vs = vs.view(n, length, attn.num_kv_heads, attn.head_dim)
            if attn.q_norm is not None:
                qs, ks = attn.q_norm(qs), attn.k_norm(ks)
            qs, ks, vs = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
            if rope is not None:
                qs, ks = apply_rope(qs, *rope), apply_rope(ks, *rope)
            out = attend(qs, ks, vs, part.sequences.attn_mask)
            outs.append(out.transpose(1, 2).reshape(n * length, -1))
        return layout.linear(torch.cat(outs), f"{p}.o_proj", attn.o_proj)

    def _head(self, hidden: Tensor, layout: _Layout) -> Tensor:
        head = self.base.lm_head
        if head is not None:
            return layout.linear(hidden, "lm_head", head)
        return F.linear(hidden, self.base.output_weight())

    def logits(self, parts: Sequence[TaskRows]) -> tuple[Tensor, list[int]]:
        """Logits [T, V] of all tasks' rows and each task's number of rows in them."""
        hidden, layout = self.hidden_states(parts)
        return self._head(hidden, layout), layout.sizes

    def forward(self, parts: Sequence[TaskRows]) -> list[Tensor]:
        """Per task: the summed cross-entropy over its trained tokens (a scalar each).

        The LM head and the loss run over groups of whole tasks of about
        ``head_chunk_tokens`` rows: the [rows, vocab] logits are the largest activation of
        a step, and past a few thousand rows they fall out of cache (measured on CPU:
        2.4x slower per row at 1920 x 1024 than at 384 x 1024) and cost memory."""
        hidden, layout = self.hidden_states(parts)
        losses: list[Tensor] = []
        for group, rows in self._head_groups(layout, hidden):
            sub = _Layout(group, layout.training, self.backend)
            labels = torch.cat([p.sequences.labels.reshape(-1) for p in group])
            token_losses = F.cross_entropy(
                self._head(rows, sub).float(), labels, ignore_index=IGNORE, reduction="none"
            )
            losses += [chunk.sum() for chunk in token_losses.split(sub.sizes)]
        return losses

    def _head_groups(self, layout: _Layout, hidden: Tensor) -> list[tuple[list[TaskRows], Tensor]]:
        """Consecutive tasks grouped up to ``head_chunk_tokens`` rows (a larger task alone)."""
        groups: list[list[TaskRows]] = []
        sizes: list[int] = []
        for part, size in zip(layout.parts, layout.sizes, strict=True):
            if groups and sizes[-1] + size <= self.head_chunk_tokens:
                groups[-1].append(part)
                sizes[-1] += size
            else:
                groups.append([part])
                sizes.append(size)
        return list(zip(groups, hidden.split(sizes), strict=True))
