"""AdamW with decay on weight matrices only, and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from legato.train.config import OptimSection


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices of linear layers decay; norms, biases and embeddings do not.

    Works on a sharded model too: a DTensor parameter reports its global ``ndim``.
    """
    embeddings = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        if param.ndim >= 2 and id(param) not in embeddings:
            decay.append(param)
        else:
            no_decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=True,
    )


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for the update after ``step`` updates (0-based).

    Linear warm-up reaches the peak on update ``warmup_steps`` (counting from 1); a half
    cosine then brings it to ``min_ratio`` exactly on the last update and holds it there.
    Ending on the minimum (rather than one step past the end) makes the last updates the
    gentlest, which is the point of annealing.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    peak = max(warmup_steps - 1, 0)
    progress = min(1.0, (step - peak) / max(1, total_steps - 1 - peak))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_lr_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimSection, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        return lr_factor(
            step, warmup_steps=cfg.warmup_steps, total_steps=total_steps, min_ratio=cfg.min_lr_ratio
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
