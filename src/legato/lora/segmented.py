"""Segmented LoRA GEMMs: every task's factors applied to that task's rows of a packed tensor.

This is the shape of Punica's SGMV kernel that multi-LoRA systems are built on: the rows
of a packed activation are split into contiguous segments, and segment ``i`` is multiplied
by its own small matrices (a task's LoRA ``A`` and ``B``; every task may have its own
rank). Two backends compute the same thing:

* ``"loop"``: one ``torch.mm``/``addmm_`` per segment, writing into the output rows in
  place. On a CPU this is the fastest (``torch._grouped_mm`` measured ~3x slower at 2k
  tokens x 8 tasks), and it performs exactly the products a task would perform alone, so
  fused and single-task LoRA terms agree bit for bit.
* ``"grouped"``: one ``torch._grouped_mm`` call per product over all segments (the GPU
  path). Each task's factor is zero-padded to a common rank (a multiple of 8 for the
  16-byte stride rule); padded rows and columns contribute exact zeros.

``pick_backend("auto")`` chooses ``grouped`` for bf16 on Hopper-class GPUs when torch has it,
else ``loop``. (The grouped path is tested on CPU in fp32; on a GPU it is not yet measured.)
Both functions below work on plain tensors; the autograd function in ``fused_linear``
calls them from its forward and backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Backend = Literal["auto", "loop", "grouped"]
_ALIGN = 8


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` of the packed input belong to one task with LoRA ``scale``."""

    start: int
    stop: int
    scale: float

    @property
    def length(self) -> int:
        return self.stop - self.start


def pick_backend(x: Tensor, backend: Backend = "auto") -> Literal["loop", "grouped"]:
    if backend != "auto":
        return backend
    grouped = (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (9, 0)  # Hopper's grouped kernels
    )
    return "grouped" if grouped else "loop"


def lora_forward(
    x: Tensor, y: Tensor, segments: Sequence[Segment], a_mats, b_mats, backend: str
) -> list[Tensor]:
    """``y[seg] += scale * x[seg] A^T B^T`` in place; returns what the backward needs."""
    if backend == "grouped":
        return _grouped_forward(x, y, segments, a_mats, b_mats)
    saved = []
    for seg, a, b in zip(segments, a_mats, b_mats, strict=True):
        h = torch.mm(x[seg.start : seg.stop], a.t()).mul_(seg.scale)
        y[seg.start : seg.stop].addmm_(h, b.t())
        saved.append(h)
    return saved


def lora_backward(
    grad_y: Tensor,
    x: Tensor,
    saved: Sequence[Tensor],
    segments: Sequence[Segment],
    a_mats,
    b_mats,
    grad_x: Tensor | None,
    backend: str,
) -> tuple[list[Tensor], list[Tensor]]:
    """Each task's ``(dA, dB)``; adds the LoRA part of ``dx`` into ``grad_x`` if given."""
    if backend == "grouped":
        return _grouped_backward(grad_y, x, saved[0], segments, a_mats, b_mats, grad_x)
    grads_a, grads_b = [], []
    for seg, h, a, b in zip(segments, saved, a_mats, b_mats, strict=True):
        g = grad_y[seg.start : seg.stop]
        grads_b.append(g.t() @ h)
        gh = torch.mm(g, b).mul_(seg.scale)
        grads_a.append(gh.t() @ x[seg.start : seg.stop])
        if grad_x is not None:
            grad_x[seg.start : seg.stop].addmm_(gh, a)
    return grads_a, grads_b


# ------------------------------------------------------------------ grouped (one launch)


def _covered(t: Tensor, segments: Sequence[Segment]) -> Tensor:
    """The rows of ``t`` the segments cover, packed (a view when they are contiguous)."""
    first, last = segments[0].start, segments[-1].stop
    if sum(s.length for s in segments) == last - first:
        return t[first:last]
    return torch.cat([t[s.start : s.stop] for s in segments])


def _scatter_add(target: Tensor, packed: Tensor, segments: Sequence[Segment]) -> None:
    offset = 0
    for s in segments:
        target[s.start : s.stop] += packed[offset : offset + s.length]
        offset += s.length


def _stack(mats: Sequence[Tensor], rows: int, cols: int) -> Tensor:
    """[G, rows, cols] with ``mats[g]`` in the top-left corner and zeros elsewhere."""
    out = mats[0].new_zeros(len(mats), rows, cols)
    for g, m in enumerate(mats):
        out[g, : m.shape[0], : m.shape[1]] = m
    return out


def _layout(x: Tensor, segments: Sequence[Segment], a_mats) -> tuple[Tensor, Tensor, int]:
    offs = torch.tensor([s.length for s in segments], device=x.device).cumsum(0).to(torch.int32)
    scale = torch.cat([x.new_full((s.length, 1), s.scale) for s in segments])
    width = -(-max(a.shape[0] for a in a_mats) // _ALIGN) * _ALIGN
    return offs, scale, width


def _grouped_forward(x, y, segments, a_mats, b_mats) -> list[Tensor]:
    offs, scale, width = _layout(x, segments, a_mats)
    xs = _covered(x, segments)
    h = torch._grouped_mm(xs, _stack([a.t() for a in a_mats], x.shape[1], width), offs=offs)
    h = h * scale
    delta = torch._grouped_mm(h, _stack([b.t() for b in b_mats], width, y.shape[1]), offs=offs)
    _scatter_add(y, delta, segments)
    return [h]


def _grouped_backward(grad_y, x, h, segments, a_mats, b_mats, grad_x):
    offs, scale, width = _layout(x, segments, a_mats)
    g = _covered(grad_y, segments)
    xs = _covered(x, segments)
    gh = torch._grouped_mm(g, _stack(b_mats, grad_y.shape[1], width), offs=offs) * scale
    full_b = torch._grouped_mm(g.t(), h, offs=offs)  # [G, out, width]
    full_a = torch._grouped_mm(gh.t(), xs, offs=offs)  # [G, width, in]
    if grad_x is not None:
        lora_dx = torch._grouped_mm(gh, _stack(a_mats, width, x.shape[1]), offs=offs)
        _scatter_add(grad_x, lora_dx, segments)
    ranks = [a.shape[0] for a in a_mats]
    grads_a = [full_a[i, :r] for i, r in enumerate(ranks)]
    return grads_a, [full_b[i, :, :r] for i, r in enumerate(ranks)]
