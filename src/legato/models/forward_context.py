"""What every block of one forward pass shares besides the hidden states: the backends.

The decoder is written once (``Block.forward`` and its attention and MLP). What differs
between training, multi-LoRA fine-tuning and serving is *how* attention reads keys and
values and *how* a linear layer runs, not the block's math, so those two are objects the
caller passes in, as vLLM passes an attention backend and wraps linear layers:

* ``attention(module, q, k, v)``: q [..., H, S, D], k/v [..., Hkv, S, D] -> [..., H, S, D].
  A rectangular training batch has leading dim B; the flat token rows of fine-tuning and
  serving have none (S is then every request's or task's tokens, back to back), and the
  backend knows where each one's tokens lie. ``module`` is the attention layer asking
  (its ``layer_index``, ``recompute_core`` and ``sliding_window``).
* ``linear(layer, x)``: a linear layer of the block applied to ``x``; LoRA backends add
  their adapters' deltas on the rows they own. The default calls the module, so module
  hooks (tensor parallelism, FP8, FSDP2) see every call.

``rope`` is the cos/sin of the tokens' positions, [..., S, rotary_dim].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor, nn

Rope = tuple[Tensor, Tensor]  # cos, sin: [..., S, rotary_dim]


class AttentionBackend(Protocol):
    def __call__(self, module: nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


LinearBackend = Callable[[nn.Module, Tensor], Tensor]


def call_layer(layer: nn.Module, x: Tensor) -> Tensor:
    """The plain linear backend: the module itself, with whatever hooks it carries."""
    return layer(x)


@dataclass(frozen=True)
class ForwardContext:
    """The positions and backends the blocks of one forward pass run with."""

    rope: Rope | None
    attention: AttentionBackend
    linear: LinearBackend = call_layer
