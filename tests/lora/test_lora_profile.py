"""What the scheduler is fed: measured activation bytes per token and fused-step timings."""

from __future__ import annotations

import torch
from lora_fixtures import SPEC, task

from legato.lora import AdapterShape, MultiLoraModel, PackingScheduler
from legato.lora.config import ScheduleSection
from legato.lora.profile import (
    activation_bytes_per_token,
    probe_adapter,
    probe_rows,
    profile_cost,
    saved_tensor_bytes,
)
from legato.lora.runner import build_packing_scheduler
from legato.models import build_model


def _model():
    return MultiLoraModel(build_model(SPEC, seed=0))


def test_saved_bytes_grow_linearly_with_packed_tokens():
    model = _model()
    adapter = probe_adapter(model, [AdapterShape(4, 8.0, 0.0, ("q_proj", "lm_head"))])
    sizes = {}
    for tokens in (32, 64, 128):
        rows = probe_rows(SPEC.vocab_size, 16, tokens, torch.device("cpu"), adapter)
        _, sizes[tokens] = saved_tensor_bytes(lambda rows=rows: model(rows))
    per_token = activation_bytes_per_token(model, adapter, 16)
    assert sizes[128] - sizes[64] == 2 * (sizes[64] - sizes[32])  # exactly linear
    assert per_token == (sizes[64] - sizes[32]) / 32
    # at least the fp32 logits row and the hidden state of every layer
    assert per_token > 4 * (SPEC.vocab_size + SPEC.num_layers * SPEC.hidden_size)


def test_profile_and_memory_budget_shape_the_scheduler():
    model = _model()
    adapter = probe_adapter(model, [AdapterShape(4, 8.0, 0.0, ("v_proj",))])
    profile = profile_cost(model, adapter, 16, [16, 40, 64], repeats=1)
    assert profile.tokens == (16, 32, 64)  # whole sequences
    assert all(s > 0 for s in profile.seconds)
    assert all(p.grad is None for p in adapter.parameters())
    tasks = [task("a", seq_len=16, batch_size=8), task("b", seq_len=32, batch_size=8)]
    per_token = activation_bytes_per_token(model, adapter, 32)
    budget = ScheduleSection(memory_budget_gb=100 * per_token / 2**30, profile=False)
    assert build_packing_scheduler(budget, model, tasks).max_tokens in range(80, 121)
    whole = build_packing_scheduler(ScheduleSection(max_tokens_per_step=10**6), model, tasks)
    assert isinstance(whole, PackingScheduler) and whole.max_tokens == 8 * 16 + 8 * 32
    assert whole.profile is not None and whole.target_tokens <= whole.max_tokens
