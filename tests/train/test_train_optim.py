"""Weight-decay groups and the warm-up + cosine schedule."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from legato.models import build_model
from legato.train.config import OptimSection, load_config, resolve_model
from legato.train.optim import build_lr_schedule, build_optimizer, lr_factor, param_groups


def test_schedule_warms_up_then_anneals_to_the_minimum() -> None:
    cfg = OptimSection(lr=1.0, min_lr_ratio=0.1, warmup_steps=10)
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_lr_schedule(optimizer, cfg, total_steps=100)
    lrs = []
    for _ in range(100):  # the lr each of the 100 updates uses
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(b > a for a, b in itertools.pairwise(lrs[:10]))
    decay = lrs[9:]
    assert all(b < a for a, b in itertools.pairwise(decay))
    assert lrs[-1] == pytest.approx(0.1)  # the last update runs at the minimum
    midpoint = 9 + (99 - 9) // 2  # half-way through the cosine: halfway between peak and min
    assert lrs[midpoint] == pytest.approx(0.55, abs=0.02)


@pytest.mark.parametrize(("warmup", "total"), [(0, 1), (0, 5), (20, 5), (4, 5)])
def test_schedule_edge_cases_stay_in_range(warmup: int, total: int) -> None:
    factors = [
        lr_factor(s, warmup_steps=warmup, total_steps=total, min_ratio=0.1) for s in range(total)
    ]
    assert all(0 < f <= 1 for f in factors) and all(math.isfinite(f) for f in factors)
    if warmup == 0:
        assert factors[0] == 1.0


def test_weight_decay_only_on_matrices() -> None:
    config = load_config(None, ["--model.preset=tiny-gpt", "--model.overrides.num_layers=1"])
    model = build_model(resolve_model(config.model), seed=0)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert "model.layers.0.self_attn.q_proj.weight" in decayed
    assert "model.embed_tokens.weight" in kept and "model.embed_positions.weight" in kept
    assert all(n.endswith("bias") or "norm" in n or "embed" in n for n in kept)
    assert len(decayed) + len(kept) == len(list(model.parameters()))
