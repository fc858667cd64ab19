"""Normalisation layers chosen by the spec.

``torch.nn.RMSNorm`` and ``torch.nn.LayerNorm`` already have the Hugging Face parameter
names (``weight``, and ``bias`` for LayerNorm), so no wrapper class is needed.
"""

from __future__ import annotations

from torch import nn

from legato.specs.model import NormKind


def build_norm(kind: NormKind, dim: int, eps: float) -> nn.Module:
    """RMSNorm (weight only) or LayerNorm (weight and bias) over the last ``dim`` features."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    return nn.RMSNorm(dim, eps=eps)


NORM_TYPES = (nn.RMSNorm, nn.LayerNorm)
