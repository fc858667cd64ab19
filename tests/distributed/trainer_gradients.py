"""What ``Trainer`` computed, for comparing a multi-process layout with one process.

Losses alone hide a wrong gradient: AdamW normalises a constant factor away and clipping
rescales it. So the equivalence tests also compare every parameter's gradient at the
first optimizer step (the full tensor, by FQN: DTensor shards gathered, pipeline stages
merged over ranks) and the gradient norm of every step (``metrics.jsonl``, before
clipping). Gradient runs set ``optim.grad_clip = 0`` so the optimizer sees raw gradients.

Nothing in ``legato`` is patched: a global optimizer step pre-hook records the gradients.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook

from legato.train.config import load_config
from legato.train.trainer import Trainer

# no clipping: the optimizer's first step sees the raw gradients
GRADIENT_ARGS = ("--optim.warmup_steps=0", "--optim.grad_clip=0")
NOISE_FLOOR = 1e-4  # of the model's gradient norm: a smaller gradient is rounding noise


def first_step_gradients(
    args: list[str],
    steps: int = 1,
    shares: dict[str, float] | None = None,
    swapped: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Train ``steps`` steps with ``args`` here (one process, or one rank of a group) and
    return the gradient of every parameter this process holds at the first optimizer step,
    as full tensors keyed by the model's parameter names. ``shares``, if given, is filled
    with the fraction of each gradient this rank holds (below 1 where ZeRO shards it);
    ``swapped`` gets the bytes of activations the run's swap moved to the host."""
    captured: dict[int, torch.Tensor] = {}
    held: dict[int, float] = {}

    def record(optimizer: torch.optim.Optimizer, *_: object) -> None:
        if captured:
            return
        for group in optimizer.param_groups:  # the same order on every rank
            for param in group["params"]:
                grad = param.grad
                if grad is not None:
                    full = grad.full_tensor() if isinstance(grad, DTensor) else grad
                    captured[id(param)] = full.detach().float().clone()
                    local = grad.to_local() if isinstance(grad, DTensor) else grad
                    held[id(param)] = local.numel() / full.numel()

    handle = register_optimizer_step_pre_hook(record)
    try:
        trainer = Trainer(load_config(None, [*args, *GRADIENT_ARGS, f"--train.steps={steps}"]))
        trainer.fit()
    finally:
        handle.remove()
    # DDP prefixes "module."; a pipeline's stages hold the full model's own parameters
    # (a tied embedding's copy on the last stage has no name of its own and is left out).
    names = {id(p): n.removeprefix("module.") for n, p in trainer.model.named_parameters()}
    if swapped is not None:
        swapped.append(trainer.swap.stats.to_host if trainer.swap is not None else 0)
    if shares is not None:
        shares.update({names[i]: share for i, share in held.items() if i in names})
    return {names[i]: grad for i, grad in captured.items() if i in names}


def train_on_rank(
    rank: int, loss_runs: dict[str, list[str]], gradient_runs: dict[str, list[str]]
) -> dict[str, dict]:
    """A ``run_ranks`` worker: each loss run's losses, each gradient run's gradients."""
    return {
        "losses": {
            name: Trainer(load_config(None, a)).fit().losses for name, a in loss_runs.items()
        },
        "gradients": {name: first_step_gradients(a) for name, a in gradient_runs.items()},
    }


def assert_same_gradients(
    ranks: list[dict[str, torch.Tensor]], want: dict[str, torch.Tensor], rtol: float
) -> None:
    """Every parameter of the one-process run has its gradient on some rank, and each
    rank's gradient equals it: ``|got - want| <= rtol * |want|`` in the 2-norm of that
    parameter (one rounding-noisy entry cannot fail fp8, a wrong factor fails any).

    A gradient that is zero in exact arithmetic (a key bias: softmax ignores a constant
    added to every score of a query) is rounding noise of ~1e-11; below ``NOISE_FLOOR`` of
    the whole model's gradient norm, a tensor's difference is measured against that floor."""
    floor = NOISE_FLOOR * torch.sqrt(sum(g.square().sum() for g in want.values())).item()
    seen: set[str] = set()
    for got in ranks:
        for name, grad in got.items():
            assert grad.shape == want[name].shape, name
            scale = max(want[name].norm().item(), floor)
            error = (grad - want[name]).norm().item() / scale
            assert error <= rtol, f"{name}: gradient off by {error:.3g} (relative), > {rtol}"
            seen.add(name)
    assert seen == set(want), sorted(set(want) ^ seen)


def grad_norms(run_dir: Path) -> list[float]:
    """The gradient norm (before clipping) of every step a run logged."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["grad_norm"] for line in lines]
