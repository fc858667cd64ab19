"""AdamW with decay on weight matrices only, and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler

from legato.train.config import OptimSection


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices of linear layers decay; norms, biases and embeddings do not.

    Works on a sharded model too: a DTensor parameter reports its global ``ndim``. Each
    of the two groups is split once more by layout (plain tensors, DTensors of each
    mesh) where a model mixes them (tensor parallelism without sp keeps plain norms):
    AdamW's ``foreach`` kernels take one kind per group. Groups carry ``decay``.
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
        {"params": part, "weight_decay": weight_decay if decays else 0.0, "decay": decays}
        for params, decays in ((decay, True), (no_decay, False))
        for part in _by_layout(params)
    ]


def _by_layout(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """``params`` split by mesh (None for plain tensors), in first-seen order."""
    parts: dict[object, list[nn.Parameter]] = {}
    for p in params:
        parts.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
    return list(parts.values()) or [[]]


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=True,
    )


@dataclass(frozen=True)
class ScheduleSegment:
    """The learning rate from update ``start`` on: linear from ``start_lr`` to ``peak_lr``
    at update ``peak`` (skipped when ``start`` is past it), then a half cosine to
    ``end_lr`` exactly at update ``end``, held after. Updates count from 0.

    A fresh run is one segment (``first``); a resume that changes the schedule appends
    one starting where the run stands (``WarmupCosine.change``), so the history of the
    learning rate stays reproducible from the checkpoint alone.
    """

    start: int
    start_lr: float
    peak_lr: float
    peak: int
    end: int
    end_lr: float

    @classmethod
    def first(cls, cfg: OptimSection, total_steps: int) -> ScheduleSegment:
        """Linear warm-up from lr/warmup_steps, peak on update warmup_steps (from 1)."""
        start_lr = cfg.lr / cfg.warmup_steps if cfg.warmup_steps else cfg.lr
        return cls(0, start_lr, cfg.lr, cfg.warmup_steps - 1, total_steps - 1, _end_lr(cfg))

    def lr(self, step: int) -> float:
        if step < self.peak:
            return self.start_lr + (self.peak_lr - self.start_lr) * (step - self.start) / (
                self.peak - self.start
            )
        begin, value = (
            (self.peak, self.peak_lr)
            if self.peak >= self.start
            else (
                self.start,
                self.start_lr,
            )
        )
        progress = min(1.0, (step - begin) / max(1, self.end - begin))
        return self.end_lr + (value - self.end_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _end_lr(cfg: OptimSection) -> float:
    return cfg.lr * cfg.min_lr_ratio


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for the update after ``step`` updates (0-based).

    Linear warm-up reaches the peak on update ``warmup_steps`` (counting from 1); a half
    cosine then brings it to ``min_ratio`` exactly on the last update and holds it there.
    Ending on the minimum (rather than one step past the end) makes the last updates the
    gentlest, which is the point of annealing.
    """
    cfg = OptimSection(lr=1.0, min_lr_ratio=min_ratio, warmup_steps=warmup_steps)
    return ScheduleSegment.first(cfg, total_steps).lr(step)


class WarmupCosine(LRScheduler):
    """Warm-up + cosine as ``ScheduleSegment``s; its state is JSON (``meta.json``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimSection, total_steps: int):
        self.segments = [ScheduleSegment.first(cfg, total_steps)]
        super().__init__(optimizer)

    def lr_at(self, step: int) -> float:
        return next(s for s in reversed(self.segments) if s.start <= step).lr(step)

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch)] * len(self.optimizer.param_groups)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "segments": [asdict(s) for s in self.segments]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_epoch = int(state["last_epoch"])
        self.segments = [ScheduleSegment(**s) for s in state["segments"]]
        self._apply()

    def change(self, cfg: OptimSection, total_steps: int) -> bool:
        """Continue under new ``optim.lr/min_lr_ratio/warmup_steps`` or ``train.steps``
        from the current update; False (nothing changes) when they are the same.

        The learning rate stays continuous, except for a new ``optim.lr``: the current
        value is scaled by new/old peak, an explicit request for another rate. From there
        it warms up to the (new) peak if warm-up is not over, then follows a half cosine
        to ``lr x min_lr_ratio`` on the (new) last step.
        """
        now, last = self.last_epoch, self.segments[-1]
        target = (cfg.lr, cfg.warmup_steps - 1, total_steps - 1, _end_lr(cfg))
        if target == (last.peak_lr, last.peak, last.end, last.end_lr):
            return False
        start_lr = self.lr_at(now) * (cfg.lr / last.peak_lr)  # x 1.0 is exact
        self.segments = [s for s in self.segments if s.start < now]
        self.segments.append(ScheduleSegment(now, start_lr, *target))
        self._apply()
        return True

    def _apply(self) -> None:
        """Set the optimizer's rate to the schedule's at the current update."""
        lr = self.lr_at(self.last_epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self._last_lr = [lr] * len(self.optimizer.param_groups)


def build_lr_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimSection, total_steps: int
) -> WarmupCosine:
    return WarmupCosine(optimizer, cfg, total_steps)


def apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: OptimSection) -> None:
    """Set AdamW's betas, eps and weight decay from ``cfg`` (the groups of
    ``param_groups``): a resumed optimizer state carries the checkpoint's values."""
    for group in optimizer.param_groups:
        group["betas"], group["eps"] = (cfg.beta1, cfg.beta2), cfg.eps
        group["weight_decay"] = cfg.weight_decay if group["decay"] else 0.0
