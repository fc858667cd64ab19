"""Split backward: B (input gradients only) then W (deferred dW = dY^T X GEMMs, in
groups) equals the fused backward; the runner on a single rank executes every schedule
exactly; the activation meter sees what a schedule holds."""

from __future__ import annotations

import pytest
import torch

from legato.errors import ConfigError
from legato.memory import ActivationSwap
from legato.models import build_model
from legato.parallel.pipeline import (
    ActivationMeter,
    DeferLinearWeightGrads,
    PipelineRunner,
    apply_weight_grads,
    build_stages,
    split_layers,
    token_cross_entropy,
    weight_grad_groups,
)
from legato.parallel.pipeline.weight_grad import deferred_params
from legato.schedule import build_schedule
from legato.specs.model import ModelSpec, MoESpec

_BASE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 61, "seq_len": 16}
LLAMA = ModelSpec(name="llama", num_kv_heads=2, ffn_hidden_size=48, **{**_BASE, "num_layers": 4})
MOE_BIAS = ModelSpec(
    name="moe", bias=True, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=24), **_BASE
)


def _batch(spec: ModelSpec, rows: int = 4):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, spec.vocab_size, (rows, spec.seq_len), generator=generator)
    return ids, torch.randint(0, spec.vocab_size, (rows, spec.seq_len), generator=generator)


@pytest.mark.parametrize("spec", [LLAMA, MOE_BIAS], ids=["llama", "moe-bias"])
def test_b_then_w_groups_equal_fused_backward(spec):
    ids, labels = _batch(spec)
    fused = build_model(spec, seed=2)
    token_cross_entropy(fused(ids), labels).backward()

    model = build_model(spec, seed=2)
    with DeferLinearWeightGrads() as defer:
        loss = token_cross_entropy(model(ids), labels)
    records = defer.records
    skip = deferred_params(records)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert linear_weights <= skip  # every linear layer's weight gradient is deferred
    rest = [p for p in model.parameters() if id(p) not in skip]
    for p, g in zip(rest, torch.autograd.grad(loss, rest), strict=True):  # B
        p.grad = g
    assert all(p.grad is None for p in model.parameters() if id(p) in skip)
    assert all(r.dy is not None for r in records)
    groups = weight_grad_groups(records, 3)
    assert [r for g in groups for r in g] == records  # contiguous, each record once
    assert all(groups)
    for group in groups:  # W, subtask by subtask
        apply_weight_grads(group)
    for (name, got), want in zip(model.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_weight_grad_groups_balance_flops():
    ids, _ = _batch(LLAMA)
    with DeferLinearWeightGrads() as defer:
        build_model(LLAMA, seed=0)(ids)
    flops = [sum(r.flops for r in g) for g in weight_grad_groups(defer.records, 4)]
    assert max(flops) < 1.6 * sum(flops) / 4
    few = weight_grad_groups(defer.records[:2], 4)  # more groups than GEMMs: some empty
    assert [r for g in few for r in g] == defer.records[:2] and sum(map(bool, few)) == 2


CASES = [
    ("gpipe", {}), ("1f1b", {}), ("zb-h1", {"w_subtasks": 2}), ("zb-2p", {"w_subtasks": 2}),
    ("zb-v", {"w_subtasks": 3}),
    ("seq1f1b", {"slices": 4}), ("svpp", {"chunks": 2, "slices": 4, "w_subtasks": 3}),
    ("svpp", {"chunks": 4, "slices": 2, "slicing": "equal-flops"}),
]  # fmt: skip


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_single_rank_runner_matches_unpipelined(name, options):
    ids, labels = _batch(LLAMA)
    ref = build_model(LLAMA, seed=5)
    ref_loss = token_cross_entropy(ref(ids), labels) / labels.numel()
    ref_loss.backward()
    schedule = build_schedule(name, stages=1, microbatches=2, **options)
    model = build_model(LLAMA, seed=5)
    runner = PipelineRunner(build_stages(model, schedule.placement, 0), schedule, rank=0)
    loss = runner.step(ids, labels)
    assert loss.item() == pytest.approx(ref_loss.item(), abs=1e-6)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=n)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_swapped_activations_give_the_same_gradients(name):
    """Activation swap under the runner (B by autograd.grad, W deferred): the blocks'
    saved tensors really leave and come back, and the gradients do not change."""
    ids, labels = _batch(LLAMA)
    ref = build_model(LLAMA, seed=5)
    (token_cross_entropy(ref(ids), labels) / labels.numel()).backward()
    schedule = build_schedule(name, stages=1, microbatches=2)
    model = build_model(LLAMA, seed=5)
    stages = build_stages(model, schedule.placement, 0)
    swap = ActivationSwap(stages[0].blocks, min_bytes=0)
    PipelineRunner(stages, schedule, rank=0).step(ids, labels)
    assert swap.stats.to_host > 0 and swap.stats.to_device == swap.stats.to_host
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7, msg=n)


def test_meter_measures_what_the_schedule_holds():
    """GPipe holds all m micro-batches at once, 1F1B on one rank only one: the measured
    peak scales with m; everything is released at the end of the step."""
    ids, labels = _batch(LLAMA, rows=8)
    peaks = {}
    for name in ("gpipe", "1f1b"):
        schedule = build_schedule(name, stages=1, microbatches=4)
        runner = PipelineRunner(
            build_stages(build_model(LLAMA, seed=0), schedule.placement, 0), schedule, rank=0
        )
        runner.step(ids, labels)
        assert runner.meter.current == 0
        peaks[name] = runner.stats.peak_activation_bytes
    assert peaks["gpipe"] / peaks["1f1b"] == pytest.approx(4, rel=0.05)


def test_meter_counts_storages_once_and_skips_parameters():
    weight = torch.nn.Parameter(torch.ones(4, 4))
    meter = ActivationMeter(exclude=[weight])
    x = torch.ones(8, 4, requires_grad=True)
    with meter.saved_tensors():
        y = (x * 2).matmul(weight).relu()  # saves x*2, weight (excluded), relu output
    assert meter.current == 2 * 8 * 4 * 4
    view = meter.hold(y[:2])  # a view of a storage already counted
    assert meter.current == 2 * 8 * 4 * 4
    y.sum().backward()
    del y
    assert meter.current == 8 * 4 * 4  # only the held view's storage is left
    del view
    assert meter.current == 0 and meter.peak == 2 * 8 * 4 * 4


def test_stage_split_and_bad_arguments():
    assert split_layers(5, 3) == (range(0, 2), range(2, 4), range(4, 5))
    schedule = build_schedule("1f1b", stages=1, microbatches=2)
    model = build_model(LLAMA, seed=0)
    with pytest.raises(ConfigError, match="layers_per_stage"):
        build_stages(model, schedule.placement, 0, layers_per_stage=[3])
    stages = build_stages(model, schedule.placement, 0)
    other = build_schedule("svpp", stages=1, microbatches=2, chunks=2)
    with pytest.raises(ConfigError, match="stages"):
        PipelineRunner(stages, other, rank=0)
    runner = PipelineRunner(stages, schedule, rank=0)
    ids, labels = _batch(LLAMA, rows=3)
    with pytest.raises(ConfigError, match="micro-batches"):
        runner.step(ids, labels)
