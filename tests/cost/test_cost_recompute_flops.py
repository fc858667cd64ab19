"""Model vs hardware FLOPs: what recompute adds."""

from __future__ import annotations

import pytest

from legato.cost import forward_flops
from legato.cost.flops import recompute_flops, training_step_flops
from legato.specs import load_model


@pytest.mark.parametrize("name", ["gpt3-175b", "llama3-8b", "mixtral-8x7b"])
def test_full_recompute_is_four_thirds_for_the_blocks(name):
    spec = load_model(name)
    fwd = forward_flops(spec, 4, spec.seq_len)
    head = fwd.lm_head
    model = training_step_flops(spec, 4, spec.seq_len)
    full = training_step_flops(spec, 4, spec.seq_len, "full")
    assert model == 3 * fwd.total
    assert full - 3 * head == pytest.approx(4 / 3 * (model - 3 * head), rel=1e-12)


def test_selective_recompute_reruns_attention_scores_only():
    spec = load_model("gpt3-175b")
    fwd = forward_flops(spec, 1, spec.seq_len, causal=False)
    extra = recompute_flops(spec, 1, spec.seq_len, "selective", causal=False)
    assert extra == fwd.attention_scores
    assert recompute_flops(spec, 1, spec.seq_len, "none") == 0
    s, h, layers = spec.seq_len, spec.hidden_size, spec.num_layers
    assert extra == 4 * s * s * h * layers  # QK^T and AV over all s x s pairs
