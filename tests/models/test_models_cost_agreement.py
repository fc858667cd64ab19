"""The built model agrees with the planner's arithmetic: its parameter count equals
``specs.params.count_params`` and a measured forward equals ``cost.flops.forward_flops``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from legato.cost.flops import forward_flops
from legato.models import build_model
from legato.specs.params import count_params
from legato.specs.registry import load_model

TINY_PRESETS = ["tiny", "tiny-gpt", "tiny-moe", "tiny-deepseek"]


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_preset_param_count(name):
    spec = load_model(name)
    assert _numel(build_model(spec, device="meta")) == count_params(spec).total


def test_zoo_param_count(zoo_spec):
    assert _numel(build_model(zoo_spec, device="meta")) == count_params(zoo_spec).total


def test_biased_multiple_shared_experts_param_count(zoo):
    spec = zoo["gelu-moe"].with_(moe=replace(zoo["gelu-moe"].moe, num_shared_experts=2))
    assert _numel(build_model(spec, device="meta")) == count_params(spec).total


def _measured_forward_flops(spec, batch: int, seq: int) -> int:
    model = build_model(spec, seed=0)
    ids = torch.randint(0, spec.vocab_size, (batch, seq))
    # The math SDPA backend runs as bmm ops the counter sees; the fused CPU kernel is
    # invisible to FlopCounterMode, which would undercount attention.
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids)
    return counter.get_total_flops()


def test_zoo_forward_flops_match_cost_model(zoo_spec):
    measured = _measured_forward_flops(zoo_spec, batch=2, seq=12)
    predicted = forward_flops(zoo_spec, 2, 12, causal=False).total
    assert measured == pytest.approx(predicted, rel=0.01)


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_preset_forward_flops_match_cost_model(name):
    spec = load_model(name)
    measured = _measured_forward_flops(spec, batch=1, seq=64)
    assert measured == pytest.approx(forward_flops(spec, 1, 64, causal=False).total, rel=0.01)
