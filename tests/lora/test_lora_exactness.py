"""Fused multi-task training gives each adapter what training it alone gives.

Three tasks with different ranks (2, 8, 4), sequence lengths (16, 48, 32), batch sizes,
step budgets, target layers, learning-rate schedules, and one with LoRA dropout. Stated
tolerance: per-step losses equal to 1e-6 absolute and every gradient tensor equal to 1e-5
of its largest entry. The only difference between the runs is how many rows each frozen
GEMM sees (BLAS may block a taller matrix differently); the LoRA terms are computed by the
same per-segment products and agree exactly.
"""

from __future__ import annotations

import torch
from lora_fixtures import SPEC, synthetic_stream, task

from legato.lora import MultiLoraModel, MultiTaskTrainer, PackingScheduler
from legato.models import build_model

TASKS = [
    task("a", rank=2, seq_len=16, batch_size=3, steps=4, seed=1, target_modules=["q_proj", "v_proj"]),
    task(
        "b", rank=8, seq_len=48, batch_size=2, steps=3, seed=2, lr=5e-3, dropout=0.1,
        target_modules=["q_proj", "o_proj", "gate_proj", "down_proj"],
    ),
    task(
        "c", rank=4, seq_len=32, batch_size=4, steps=5, seed=3, warmup_steps=2,
        target_modules=["up_proj", "k_proj", "lm_head"],
    ),
]  # fmt: skip


def _train(names: str, max_tokens: int = 4096):
    torch.manual_seed(0)
    base = build_model(SPEC, seed=0)
    grads: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    def capture(name, step, adapter):
        grads[name, step] = {k: p.grad.clone() for k, p in adapter.named_parameters()}

    trainer = MultiTaskTrainer(
        MultiLoraModel(base), PackingScheduler(max_tokens), before_update=capture
    )
    for t in TASKS:
        if t.name in names:
            trainer.add_task(t, synthetic_stream(t.seed))
    trainer.run()
    losses = {name: [r.loss for r in records] for name, records in trainer.history.items()}
    return grads, losses, trainer, base


def test_fused_gradients_and_losses_equal_each_task_alone():
    fused_grads, fused_losses, fused, base = _train("abc")
    assert fused.fused_steps == 5  # every task's whole batch in each fused step
    assert all(p.grad is None for p in base.parameters())
    for t in TASKS:
        alone_grads, alone_losses, _, _ = _train(t.name)
        assert len(alone_losses[t.name]) == t.steps
        torch.testing.assert_close(fused_losses[t.name], alone_losses[t.name], rtol=0, atol=1e-6)
        for step in range(1, t.steps + 1):
            for key, want in alone_grads[t.name, step].items():
                got = fused_grads[t.name, step][key]
                assert want.abs().max() > 0 or step == 1  # B = 0 at init: dA = 0 at step 1
                assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (t.name, step, key)


def test_batches_split_over_fused_steps_accumulate_to_the_same_step():
    """A tight token budget splits batches (gradient accumulation across fused steps);
    without dropout the losses match the unsplit run to rounding."""
    _, whole, _, _ = _train("ac")
    _, split, trainer, _ = _train("ac", max_tokens=40)
    assert trainer.fused_steps > 5
    for name in "ac":
        torch.testing.assert_close(split[name], whole[name], rtol=1e-6, atol=1e-6)
