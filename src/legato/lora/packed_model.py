"""The frozen backbone run over several tasks' tokens at once, each with its own adapter.

``Transformer.forward`` takes one rectangular ``[B, S]`` batch; fused multi-task training
needs tasks of different sequence lengths in one pass. So the decoder runs over a flat
token layout (``Decoder.forward`` with this module's backends): every task's ``[n_i, L_i]``
sequences are flattened and concatenated into ``[T, h]`` rows, every linear layer runs
once over all rows through :func:`fused_lora_linear` (the linear backend), and only
attention, which has no weights to share, runs per task on its own ``[n_i, L_i]`` view
(the attention backend). With a single task this *is* legato's single-task LoRA path, so
fused and single-task training execute the same code and differ only in how many rows
each GEMM sees.

Dense, MoE and MLA backbones run; LoRA adapts the layers the block's linear backend runs
(attention projections, dense MLP layers, the LM head), not the experts or routers inside
an MoE layer (``adapter.linear_layers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from legato.lora.adapter import LoraAdapter
from legato.lora.fused_linear import Segment, fused_lora_linear
from legato.lora.segmented import Backend
from legato.lora.task_data import IGNORE, Sequences
from legato.models.attention import SdpaAttention
from legato.models.transformer import Transformer


@dataclass(frozen=True)
class TaskRows:
    """One task's part of a fused step: its adapter (None = base model only) and sequences."""

    task: str
    adapter: LoraAdapter | None
    sequences: Sequences


class _Layout:
    """Where each task's rows sit in the packed ``[T, h]`` activations, and the backends
    that use it.

    Per-task views are taken with ``split`` rather than slicing: the backward of a slice
    allocates a zero tensor of the full packed size, which for k tasks costs k times the
    activation, while the backward of a split is one concatenation.
    """

    def __init__(
        self,
        parts: Sequence[TaskRows],
        training: bool,
        backend: Backend,
        paths: dict[nn.Module, str],
    ) -> None:
        self.parts = list(parts)
        self.sizes = [part.sequences.num_tokens for part in self.parts]
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for size in self.sizes:
            self.bounds.append((start, start + size))
            start += size
        self.training = training
        self.backend = backend
        self.paths = paths

    def linear(self, layer: nn.Module, x: Tensor) -> Tensor:
        """The linear backend: ``layer`` over all rows, plus each task's LoRA on its rows
        if it targets the layer."""
        path = self.paths[layer]
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

    def attention(self, module: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The attention backend: q [H, T, D] (k/v [Hkv, T, D]), each task's rows viewed
        as its [n, H, L, D] batch and attended with its own mask."""
        outs = []
        per_task = zip(
            self.parts,
            q.split(self.sizes, -2),
            k.split(self.sizes, -2),
            v.split(self.sizes, -2),
            strict=True,
        )
        for part, qs, ks, vs in per_task:
            shape = part.sequences.input_ids.shape  # n, L
            qs, ks, vs = (t.unflatten(-2, shape).transpose(0, 1) for t in (qs, ks, vs))
            out = SdpaAttention(part.sequences.attn_mask)(module, qs, ks, vs)
            outs.append(out.transpose(0, 1).flatten(1, 2))
        return torch.cat(outs, dim=-2)

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


class MultiLoraModel(nn.Module):
    """A frozen :class:`Transformer` that computes per-task losses for packed task rows."""

    def __init__(
        self, base: Transformer, backend: Backend = "auto", head_chunk_tokens: int = 1024
    ) -> None:
        super().__init__()
        self.base = base.requires_grad_(False).eval()
        self.backend = backend
        self.head_chunk_tokens = head_chunk_tokens
        self._paths = {module: path for path, module in base.named_modules()}

    def _layout(self, parts: Sequence[TaskRows], training: bool) -> _Layout:
        return _Layout(parts, training, self.backend, self._paths)

    def hidden_states(self, parts: Sequence[TaskRows]) -> tuple[Tensor, _Layout]:
        """Final-normed hidden states [T, h] of all tasks' rows, packed in order."""
        layout = self._layout(parts, self.training and torch.is_grad_enabled())
        ids = torch.cat([p.sequences.input_ids.reshape(-1) for p in parts])
        positions = torch.cat([p.sequences.position_ids.reshape(-1) for p in parts])
        hidden = self.base.model(ids, positions, attention=layout.attention, linear=layout.linear)
        return hidden, layout

    def _head(self, hidden: Tensor, layout: _Layout) -> Tensor:
        head = self.base.lm_head
        if head is not None:
            return layout.linear(head, hidden)
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
            sub = self._layout(group, layout.training)
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
