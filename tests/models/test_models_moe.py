"""The reference MoE block against a per-token loop over experts, router rules, stats."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from legato.models import build_model
from legato.models.moe import MoE, load_balance_loss


def _moe(spec, seed: int) -> MoE:
    moe = MoE(spec)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return moe


def _expert_mlp(moe: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    ex = moe.experts

    def proj(name, v):
        bias = getattr(ex, f"{name}_bias")
        return v @ getattr(ex, name)[e].T + (0 if bias is None else bias[e])

    up = proj("up_proj", x)
    if ex.gate_proj is None:
        hidden = F.gelu(up, approximate="tanh")
    else:
        hidden = F.silu(proj("gate_proj", x)) * up
    return proj("down_proj", hidden)


def _per_token_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token on its own: score, pick top-k, weighted sum of those experts' MLPs."""
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        logits = moe.gate.weight @ token
        if moe.gate.score == "softmax":
            scores = logits.softmax(-1)
            chosen = scores.topk(moe.top_k).indices
        else:
            scores = logits.sigmoid()
            chosen = (scores + moe.gate.e_score_correction_bias).topk(moe.top_k).indices
        weights = scores[chosen] / scores[chosen].sum()
        out = sum(w * _expert_mlp(moe, int(e), token) for w, e in zip(weights, chosen, strict=True))
        if moe.shared_experts is not None:
            out = out + moe.shared_experts(token)
        rows.append(out)
    return torch.stack(rows).view_as(x)


@pytest.mark.parametrize("name", ["mixtral", "gelu-moe", "deepseek"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_equals_per_token_loop_outputs_and_gradients(zoo, name, top_k):
    spec = zoo[name]
    spec = spec.with_(moe=replace(spec.moe, top_k=top_k))
    moe = _moe(spec, seed=top_k)
    # 3 tokens over 4 experts at top-1: some expert surely receives none.
    tokens = 3 if top_k == 1 else 10
    x = torch.randn(1, tokens, spec.hidden_size, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = moe(x)
    expected = _per_token_reference(moe, x_ref)
    torch.testing.assert_close(out, expected)

    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, [x, *moe.parameters()], grad_out)
    theirs = torch.autograd.grad(expected, [x_ref, *moe.parameters()], grad_out, allow_unused=True)
    for (name_, _), a, b in zip(moe.named_parameters(), ours[1:], theirs[1:], strict=True):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, msg=name_)
    torch.testing.assert_close(ours[0], theirs[0])

    counts = moe.last_expert_counts
    assert counts.sum() == tokens * top_k
    if top_k == 1:
        idle = int((counts == 0).nonzero()[0])
        # The idle expert gets a zero gradient, not None (FSDP/DDP need every grad).
        assert torch.count_nonzero(ours[1 + _param_index(moe, "experts.up_proj")][idle]) == 0


def _param_index(moe: MoE, name: str) -> int:
    return [n for n, _ in moe.named_parameters()].index(name)


def test_sigmoid_router_bias_selects_but_does_not_weight(zoo):
    moe = _moe(zoo["deepseek"], seed=5)
    x = torch.randn(6, zoo["deepseek"].hidden_size)
    plain = moe.gate(x)
    with torch.no_grad():
        moe.gate.e_score_correction_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))
    biased = moe.gate(x)
    assert (biased.indices == 3).any(dim=-1).all()  # expert 3 is always picked
    torch.testing.assert_close(biased.scores, plain.scores)  # scores ignore the bias
    chosen = torch.sigmoid(x @ moe.gate.weight.T).gather(-1, biased.indices)
    torch.testing.assert_close(biased.weights, chosen / chosen.sum(-1, keepdim=True))
    assert "mlp.gate.e_score_correction_bias" not in dict(moe.named_parameters())
    assert "gate.e_score_correction_bias" in moe.state_dict()


def test_softmax_router_has_no_bias_buffer(zoo):
    moe = MoE(zoo["mixtral"])
    assert "gate.e_score_correction_bias" not in moe.state_dict()


def test_load_balance_loss_and_stats(zoo):
    uniform = torch.full((8, 4), 0.25)
    assert load_balance_loss(uniform, torch.tensor([4, 4, 4, 4])).item() == pytest.approx(1.0)
    skewed = torch.tensor([[0.97, 0.01, 0.01, 0.01]]).expand(8, 4)
    assert load_balance_loss(skewed, torch.tensor([8, 0, 0, 0])).item() > 3.5

    moe = _moe(zoo["mixtral"], seed=7)
    moe(torch.randn(2, 5, zoo["mixtral"].hidden_size))
    assert moe.last_expert_counts.shape == (4,)
    assert moe.last_expert_counts.sum() == 2 * 5 * 2
    (grad,) = torch.autograd.grad(moe.last_aux_loss, moe.gate.weight)
    assert grad.abs().sum() > 0


def test_model_sums_aux_losses_of_its_moe_layers(zoo):
    spec = zoo["deepseek"].with_(num_layers=3)  # layer 0 dense, layers 1 and 2 MoE
    model = build_model(spec, seed=0)
    assert model.moe_aux_loss() is None  # no forward yet
    model(torch.randint(0, spec.vocab_size, (2, 6)))
    layers = model.moe_layers()
    assert layers == [model.blocks[1].mlp, model.blocks[2].mlp]
    torch.testing.assert_close(model.moe_aux_loss(), sum(m.last_aux_loss for m in layers))
    assert build_model(zoo["llama"], device="meta").moe_aux_loss() is None
