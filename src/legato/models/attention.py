"""Grouped-query self-attention (GQA; MHA and MQA are special cases) with HF Llama names.

The module computes projections, per-head norms and RoPE, and hands q, k, v to the
attention backend of its ``ForwardContext`` (``forward_context``). Training's backend is
:class:`SdpaAttention`; all its attention goes through :func:`attend`, so the mask
convention lives in one place: without ``attn_mask`` attention is causal; with one, the mask *replaces* the causal
mask (a boolean mask, True = may attend, or an additive float mask, broadcastable to
[B, H, S, S]), so packed documents can reset positions and block cross-document attention.

:func:`attention_override` lets a runtime reroute every ``attend`` call for a while
without touching the modules: the pipeline runtime's sequence slices attend to the K/V
of earlier slices this way (``legato.models.slice_attention``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from legato.errors import ConfigError
from legato.models.forward_context import ForwardContext
from legato.models.norms import build_norm
from legato.models.rope import apply_rope
from legato.specs.model import ModelSpec

AttendFn = Callable[[Tensor, Tensor, Tensor, "Tensor | None"], Tensor]

_OVERRIDE: ContextVar[AttendFn | None] = ContextVar("legato_attend_override", default=None)


@contextlib.contextmanager
def attention_override(fn: AttendFn) -> Iterator[None]:
    """Within the block, every :func:`attend` call is ``fn(q, k, v, attn_mask)`` instead."""
    token = _OVERRIDE.set(fn)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    *,
    recompute: bool = False,
    window: int | None = None,
) -> Tensor:
    """SDPA over q [B, H, S, D] and k/v [B, Hkv, S, D]; K/V heads are shared by groups.

    ``recompute``: keep only q, k, v for the backward and run the core again there
    (selective recompute, ``parallel.recompute``); the override in force then is used.
    ``window``: a query sees at most that many positions, its own included (Mistral's
    sliding window, as HF masks it), on top of ``attn_mask``.
    """
    if recompute:
        return checkpoint(attend, q, k, v, attn_mask, window=window, use_reentrant=False)
    override = _OVERRIDE.get()
    if override is not None:
        if window is not None:
            raise ConfigError(
                f"model.sliding_window ({window}): context parallelism and sequence slices "
                "run full causal attention; train this model with cp = 1 and no slices"
            )
        return override(q, k, v, attn_mask)
    if window is not None and window < q.shape[-2]:
        attn_mask = windowed(attn_mask, window, q.shape[-2], q.device)
    return grouped_sdpa(q, k, v, attn_mask, is_causal=attn_mask is None)


def windowed(mask: Tensor | None, window: int, length: int, device: torch.device) -> Tensor:
    """``mask`` (None = causal) restricted to the last ``window`` positions up to each
    query of a ``length``-token sequence, as a boolean or additive mask like ``mask``."""
    band = visible(torch.arange(length, device=device), length, window)
    if mask is None:
        return band
    if mask.dtype == torch.bool:
        return mask & band
    return mask.masked_fill(~band, float("-inf"))


def visible(positions: Tensor, keys: int, window: int | None) -> Tensor:
    """Boolean [len(positions), keys]: key j is seen by the query at position i when
    j <= i and, with a sliding ``window``, i - j < window (HF's Mistral mask)."""
    query, key = positions[:, None], torch.arange(keys, device=positions.device)[None, :]
    seen = key <= query
    return seen & (query - key < window) if window is not None else seen


def grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: object, is_causal: bool) -> Tensor:
    """torch's SDPA with K/V heads shared by groups of query heads (GQA)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=k.shape[1] != q.shape[1]
    )


@dataclass(frozen=True)
class SdpaAttention:
    """Training's attention backend: a rectangular batch q [B, H, S, D] through
    :func:`attend` with ``mask`` (None = causal)."""

    mask: Tensor | None = None

    def __call__(self, module: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attend(
            q, k, v, self.mask, recompute=module.recompute_core, window=module.sliding_window
        )


class Attention(nn.Module):
    """``q_proj``/``k_proj``/``v_proj``/``o_proj``; optional per-head ``q_norm``/``k_norm``."""

    def __init__(self, spec: ModelSpec, layer_index: int = 0) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.sliding_window = spec.sliding_window
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.recompute_core = False  # set by parallel.recompute (selective)
        h, d = spec.hidden_size, spec.head_dim
        qkv_bias = spec.bias or spec.qkv_bias
        self.q_proj = nn.Linear(h, spec.num_heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * d, bias=qkv_bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * d, bias=qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * d, h, bias=spec.bias)
        if spec.qk_norm:
            self.q_norm = build_norm(spec.norm, d, spec.norm_eps)
            self.k_norm = build_norm(spec.norm, d, spec.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """``x`` [..., S, h] -> [..., S, h]; the leading dims are the backend's business."""
        q = ctx.linear(self.q_proj, x).unflatten(-1, (self.num_heads, self.head_dim))
        k = ctx.linear(self.k_proj, x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = ctx.linear(self.v_proj, x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2)
        if ctx.rope is not None:
            q, k = apply_rope(q, *ctx.rope), apply_rope(k, *ctx.rope)
        out = ctx.attention(self, q, k, v)
        return ctx.linear(self.o_proj, out.transpose(-3, -2).flatten(-2))
