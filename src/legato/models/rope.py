"""Rotary position embedding (RoPE) with precomputed cos/sin tables.

The tables are non-persistent buffers: they are derived from the spec, never saved in a
checkpoint, and :meth:`RotaryEmbedding.reset_buffers` rebuilds them after ``to_empty`` (meta-device
builds). The rotation uses the "rotate half" layout of Hugging Face Llama checkpoints.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """cos/sin tables of shape [max_positions, dim] looked up by position id."""

    def __init__(self, dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        self.dim = dim
        self.max_positions = max_positions
        self.theta = theta
        self.register_buffer("cos", torch.empty(max_positions, dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, dim), persistent=False)
        if self.cos.device.type != "meta":
            self.reset_buffers()

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """(Re)compute the tables in float32 on the buffers' device."""
        device = self.cos.device
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        inv_freq = 1.0 / (self.theta**exponents)
        positions = torch.arange(self.max_positions, device=device, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for ``position_ids`` [B, S], each [B, S, dim]."""
        return self.cos[position_ids], self.sin[position_ids]


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate ``x`` [B, H, S, D] by the angles in ``cos``/``sin`` [B, S, D].

    ``interleaved``: the checkpoint's projection stores rotary pairs as adjacent features
    (DeepSeek-V3); they are regrouped into two halves before rotating, as HF does.
    """
    if interleaved:
        b, h, s, d = x.shape
        x = x.view(b, h, s, d // 2, 2).transpose(3, 4).reshape(b, h, s, d)
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    return x * cos + _rotate_half(x) * sin
