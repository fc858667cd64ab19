"""Rotary position embedding (RoPE) with precomputed cos/sin tables.

The tables are non-persistent buffers: they are derived from the spec, never saved in a
checkpoint, and :meth:`RotaryEmbedding.reset_buffers` rebuilds them after ``to_empty`` (meta-device
builds). The rotation uses the "rotate half" layout of Hugging Face Llama checkpoints;
``scaling`` (:class:`RopeScaling`) rescales the frequencies as Llama 3.1 does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from legato.specs.model import RopeScaling


class RotaryEmbedding(nn.Module):
    """cos/sin tables of shape [max_positions, dim] looked up by position id."""

    def __init__(
        self, dim: int, max_positions: int, theta: float, scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        self.dim = dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
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
        if self.scaling is not None:
            inv_freq = llama3_inv_freq(inv_freq, self.scaling)
        positions = torch.arange(self.max_positions, device=device, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin for ``position_ids`` [..., S], each [..., S, dim]."""
        return self.cos[position_ids], self.sin[position_ids]


def llama3_inv_freq(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    """Llama 3.1's scaled frequencies (HF ``rope_type = "llama3"``): long wavelengths are
    divided by ``factor`` so the model reaches past its pretraining context, short ones kept
    (local order stays sharp), the band between blended linearly in ``context / wavelength``.
    """
    context = scaling.original_max_position_embeddings
    low, high, factor = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
    wavelen = 2 * math.pi / inv_freq
    stretched = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * stretched / factor + smooth * stretched
    in_band = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(in_band, blended, stretched)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate ``x`` [..., H, S, D] by the angles in ``cos``/``sin`` [..., S, D] (a batch's
    [B, H, S, D] with [B, S, D], or flat token rows [H, T, D] with [T, D]).

    ``interleaved``: the checkpoint's projection stores rotary pairs as adjacent features
    (DeepSeek-V3); they are regrouped into two halves before rotating, as HF does.
    """
    if interleaved:
        x = x.unflatten(-1, (-1, 2)).transpose(-2, -1).flatten(-2)
    cos = cos.unsqueeze(-3).to(x.dtype)
    sin = sin.unsqueeze(-3).to(x.dtype)
    return x * cos + _rotate_half(x) * sin
