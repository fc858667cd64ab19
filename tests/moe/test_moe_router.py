"""Router rules: selection bias, the aux-loss-free update, z-loss, per-step load stats."""

from __future__ import annotations

import math

import pytest
import torch
from moe_testlib import make_layer, tokens

from legato.moe import Router, end_step, load_balance_loss, router_z_loss


def _router(score: str, expert_bias: bool | None = None) -> Router:
    router = Router(8, 4, 2, score, expert_bias)
    router.weight.data = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    return router


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_bias_changes_selection_never_weights(score):
    router = _router(score, expert_bias=True)
    x = torch.randn(6, 8)
    plain = router(x)
    router.e_score_correction_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))
    biased = router(x)
    assert (biased.indices == 3).any(dim=-1).all()
    torch.testing.assert_close(biased.scores, plain.scores)
    chosen = biased.scores.gather(-1, biased.indices)
    torch.testing.assert_close(biased.weights, chosen / chosen.sum(-1, keepdim=True))


def test_bias_buffer_defaults_to_sigmoid_routers_only():
    assert _router("sigmoid").e_score_correction_bias is not None
    assert _router("softmax").e_score_correction_bias is None
    assert "load" not in _router("sigmoid").state_dict()  # statistics are not checkpointed


def test_update_bias_moves_against_the_load():
    router = _router("sigmoid")
    router.update_bias(torch.tensor([10.0, 2.0, 4.0, 0.0]), rate=0.01)
    torch.testing.assert_close(
        router.e_score_correction_bias, torch.tensor([-0.01, 0.01, 0.0, 0.01])
    )
    softmax = _router("softmax")
    softmax.update_bias(torch.tensor([9.0, 0.0, 0.0, 0.0]), rate=0.01)  # no bias: no-op
    assert softmax.e_score_correction_bias is None


def test_bias_rule_balances_a_skewed_router():
    router = _router("sigmoid")
    router.weight.data[0] += 0.5  # skewed: expert 2 gets far more than its share
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(1)) + 0.5
    router_layer = _wrap(router)
    router(x)
    start = end_step(router_layer).max_violation[0]
    for _ in range(50):
        router(x)
        stats = end_step(router_layer, bias_rate=0.02)
    router(x)
    assert start > 0.4
    assert end_step(router_layer).max_violation[0] < 0.1
    assert stats.counts[0] and sum(stats.counts[0]) == 512 * 2


def _wrap(router: Router) -> torch.nn.Module:
    """A layer holding ``router`` as its gate, so end_step finds it."""
    layer = make_layer("gelu-sigmoid-bias-shared")
    layer.gate = router
    return layer


def test_z_loss_and_load_balance_loss_values():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    expected = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(expected)
    uniform = torch.full((8, 4), 0.25)
    assert load_balance_loss(uniform, torch.tensor([4, 4, 4, 4])).item() == pytest.approx(1.0)
    skewed = torch.tensor([[0.97, 0.01, 0.01, 0.01]]).expand(8, 4)
    assert load_balance_loss(skewed, torch.tensor([8, 0, 0, 0])).item() > 3.5


def test_end_step_reports_and_resets_the_load():
    layer = make_layer("swiglu-softmax")
    layer(tokens(5, 16, seed=0))
    layer(tokens(7, 16, seed=1))  # two micro-batches in one step
    stats = end_step(layer)
    assert sum(stats.counts[0]) == (5 + 7) * 2
    assert stats.idle_experts == [1]  # the last expert never gets a token
    counts = torch.tensor(stats.counts[0], dtype=torch.float)
    assert stats.max_violation[0] == pytest.approx((counts.max() / counts.mean() - 1).item())
    assert layer.gate.load.sum() == 0
    assert end_step(torch.nn.Linear(2, 2)).counts == []
