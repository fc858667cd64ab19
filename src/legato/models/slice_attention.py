"""Causal attention over sequence slices with a per-micro-batch K/V prefix cache.

MEPipe and Seq1F1B cut a micro-batch's sequence into k slices that run forward one after
the other. Slice j attends to ``cat(K/V of slices < j, its own K/V)`` with the causal mask
aligned to the end (query t of the slice is token ``start_j + t``; RoPE gets the same
offset through the position ids the caller passes).

The prefix enters slice j's graph as *detached leaves*, so every slice has a graph of its
own: its backward runs alone and returns dK/dV for the prefix, which :class:`PrefixKVCache`
adds up per earlier slice. Slice i's backward then feeds those sums as extra output
gradients of its own K/V, which is why slices go backward in reverse order
(j = k-1 .. 0), the dependency rule of ``legato.schedule``. Keeping the graphs apart is
what lets a backward be split into input (B) and weight (W) passes per slice: nothing of
slice i is reached from slice j's graph except through the leaves.

Memory: slice j > 0 saves only its own q/K/V and points at the cached prefix (which the
cache holds anyway); its backward recomputes the slice's attention (scores and softmax,
no linear layers) from them. Saving SDPA's concatenated K/V instead would store a copy
of the prefix per slice, (k+1)/2 times the K/V of the whole micro-batch per layer.

Under context parallelism (``context``: ``parallel.context.ContextParallel``) each rank
holds its zigzag share of every slice: a slice's K/V are all-gathered over cp before they
are cached (so later slices see the whole prefix and their dK/dV reach every rank through
the gather's reduce-scatter), and the local queries attend with ``context.attend_prefix``.

Usage for one slice (the pipeline runtime does exactly this per unit)::

    with attention_override(cache.attend_fn(j)):
        out = layers(x_j, positions start_j..end_j)
    ...
    outputs, grads = cache.backward_terms(j)          # own K/V + later slices' dK/dV
    leaves = cache.prefix_leaves(j)
    g = torch.autograd.grad([out, *outputs], [x_j, *leaves], [d_out, *grads])
    cache.add_prefix_grads(j, g[1:]); cache.release(j)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.nn.attention.bias import causal_lower_right

from legato.errors import ConfigError
from legato.models.attention import AttendFn, grouped_sdpa

KV = tuple[Tensor, Tensor]


class ContextAttention(Protocol):
    """Attention over a sequence split across ranks (context parallelism)."""

    def gather_kv(self, k: Tensor, v: Tensor) -> KV: ...

    def attend_prefix(
        self, q: Tensor, k: Tensor, v: Tensor, prefix: Sequence[Tensor]
    ) -> Tensor: ...


class PrefixKVCache:
    """K/V of the slices of one micro-batch on one model chunk, per layer.

    ``slices`` is k. For slice j the cache keeps its in-graph K/V (the tensors its own
    attention used, for its backward), detached leaves of them for later slices (sharing
    storage, no copy) and the dK/dV later slices sent back.
    """

    def __init__(self, slices: int, context: ContextAttention | None = None) -> None:
        self.slices = slices
        self.context = context
        self._outputs: dict[int, list[KV]] = {}  # slice -> per layer, in-graph
        self._leaves: dict[int, list[KV]] = {}  # slice -> per layer, detached
        self._grads: dict[int, list[list[Tensor | None]]] = {}  # slice -> layer -> [dk, dv]

    def attend_fn(self, seq_slice: int) -> AttendFn:
        """The ``attend`` replacement for slice ``seq_slice``'s forward: call it once per
        layer, in layer order (each call is the next layer)."""
        if seq_slice in self._outputs:
            raise RuntimeError(f"slice {seq_slice}: forward already ran on this cache")
        if any(i not in self._leaves for i in range(seq_slice)):
            raise RuntimeError(f"slice {seq_slice}: the forward of an earlier slice is missing")
        outputs: list[KV] = []
        self._outputs[seq_slice] = outputs
        keep = seq_slice < self.slices - 1
        if keep:
            self._leaves[seq_slice] = []

        def attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
            if attn_mask is not None:
                raise ConfigError(
                    "attn_mask: sequence slices support plain causal attention only; "
                    "run packed-document masks with slices = 1"
                )
            layer = len(outputs)
            if self.context is not None:  # the slice's whole K/V, gathered over cp
                k, v = self.context.gather_kv(k, v)
            outputs.append((k, v))
            if keep:
                self._leaves[seq_slice].append((_leaf(k), _leaf(v)))
            prefix = [t for i in range(seq_slice) for t in self._leaves[i][layer]]
            if self.context is not None:
                return self.context.attend_prefix(q, k, v, prefix)
            if seq_slice == 0:
                return grouped_sdpa(q, k, v, None, is_causal=True)
            return _PrefixAttention.apply(q, k, v, *prefix)

        return attend

    def slice_tensors(self, seq_slice: int) -> list[Tensor]:
        """The K/V tensors slice ``seq_slice`` keeps alive until its backward."""
        return [t for kv in self._outputs.get(seq_slice, []) for t in kv]

    def backward_terms(self, seq_slice: int) -> tuple[list[Tensor], list[Tensor]]:
        """Slice ``seq_slice``'s own K/V with the dK/dV later slices sent back: extra
        (outputs, grad_outputs) for its backward. Empty for the last slice."""
        outputs: list[Tensor] = []
        grads: list[Tensor] = []
        for (k, v), layer_grads in zip(
            self._outputs[seq_slice], self._grads.get(seq_slice, []), strict=False
        ):
            for tensor, grad in zip((k, v), layer_grads, strict=True):
                if grad is not None and tensor.requires_grad:
                    outputs.append(tensor)
                    grads.append(grad)
        return outputs, grads

    def prefix_leaves(self, seq_slice: int) -> list[Tensor]:
        """The leaves slice ``seq_slice`` attended to: per layer, per earlier slice, K then V."""
        layers = len(self._outputs[seq_slice])
        return [
            t for layer in range(layers) for i in range(seq_slice) for t in self._leaves[i][layer]
        ]

    def add_prefix_grads(self, seq_slice: int, grads: list[Tensor | None]) -> None:
        """Add slice ``seq_slice``'s dK/dV (ordered as ``prefix_leaves``) to earlier slices."""
        layers = len(self._outputs[seq_slice])
        it = iter(grads)
        for layer in range(layers):
            for i in range(seq_slice):
                slot = self._grads.setdefault(i, [[None, None] for _ in range(layers)])[layer]
                for n in range(2):
                    grad = next(it)
                    if grad is not None:
                        slot[n] = grad if slot[n] is None else slot[n] + grad

    def release(self, seq_slice: int) -> None:
        """Forget slice ``seq_slice`` after its backward (later slices are done with it)."""
        for store in (self._outputs, self._leaves, self._grads):
            store.pop(seq_slice, None)

    @property
    def empty(self) -> bool:
        return not self._outputs


def _prefix_attention(q: Tensor, k: Tensor, v: Tensor, prefix: Sequence[Tensor]) -> Tensor:
    """Causal attention of the slice ``q`` over ``prefix`` (K0, V0, K1, V1, ...) and
    its own ``k``/``v``, the mask aligned to the end (the slice is the sequence's tail)."""
    keys = torch.cat([*prefix[0::2], k], dim=2)
    values = torch.cat([*prefix[1::2], v], dim=2)
    mask = causal_lower_right(q.shape[2], keys.shape[2])
    return grouped_sdpa(q, keys, values, mask, is_causal=False)


class _PrefixAttention(torch.autograd.Function):
    """``_prefix_attention`` that saves its inputs only (no concatenated copy of the
    prefix) and recomputes the attention in its backward."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, *prefix: Tensor) -> Tensor:
        ctx.save_for_backward(q, k, v, *prefix)
        return _prefix_attention(q, k, v, prefix)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        inputs = [t.detach().requires_grad_(need) for t, need in
                  zip(ctx.saved_tensors, ctx.needs_input_grad, strict=True)]  # fmt: skip
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = _prefix_attention(inputs[0], inputs[1], inputs[2], inputs[3:])
            grads = iter(torch.autograd.grad(out, wanted, grad))
        return tuple(next(grads) if t.requires_grad else None for t in inputs)


def _leaf(t: Tensor) -> Tensor:
    leaf = t.detach()
    return leaf.requires_grad_() if t.requires_grad else leaf
