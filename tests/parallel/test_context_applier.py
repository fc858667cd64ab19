"""Context parallelism: the zigzag split and cp-sharded attention on real gloo processes.

The cp runs lay the model out as the trainer does (``apply_context_parallel``, FSDP2 over
the flattened ``dp_cp`` mesh dimension, the loss convention ``summed token loss *
(dp*cp) / label tokens of the global batch``) and must give the one-process model's loss
and every parameter's gradient on the same batch, within 1e-5 relative (per-parameter
2-norm): a gradient scaled by any constant, or one missing the other ranks' dK/dV, fails.
The MoE load-balance loss is left out of the objective: it is a statistic of each rank's
own tokens under cp as under dp.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gloo_harness import run_ranks
from legato.models import build_model
from legato.parallel.context import (
    apply_context_parallel,
    check_context_parallel,
    shard_sequence,
    zigzag_positions,
)
from legato.parallel.pipeline.runner import IGNORE_INDEX, token_cross_entropy
from legato.parallel.pipeline.stages import StageModule
from legato.specs.model import ModelSpec
from legato.specs.registry import load_model
from legato.specs.strategy import Strategy, StrategyError

SEQ, ROWS, TOL = 32, 2, 1e-5  # data seq_len 32 < the presets' 256: the check uses the data's
STAGE = "/stage"


def batch(rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and shifted labels [rows, SEQ], some labels ignored."""
    tokens = torch.randint(0, vocab, (rows, SEQ + 1), generator=torch.Generator().manual_seed(1))
    labels = tokens[:, 1:].clone()
    labels[0, 5:9] = IGNORE_INDEX
    return tokens[:, :-1], labels


def spec_of(run: str) -> ModelSpec:
    """The run's preset with 2 layers (the second of tiny-deepseek is its first MoE one)."""
    return replace(load_model(run.removesuffix(STAGE)), num_layers=2)


def one_process(run: str, rows: int) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean token loss of the batch and every parameter's gradient, unsplit."""
    model = build_model(spec_of(run), seed=0)
    inputs, labels = batch(rows, model.spec.vocab_size)
    loss = token_cross_entropy(model(inputs), labels) / (labels != IGNORE_INDEX).sum()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def cp_rank_step(rank: int, runs: list[str], dp: int, cp: int) -> dict[str, tuple]:
    """One forward/backward per run on this rank's rows (dp) and zigzag shard (cp). A run
    ``PRESET/stage`` lays out the whole model as one pipeline stage and passes the shard's
    position ids itself (as the pipeline runner does); others leave them to the hook."""
    mesh = init_device_mesh("cpu", (1, dp, cp, 1), mesh_dim_names=("pp", "dp", "cp", "tp"))
    mesh["dp", "cp"]._flatten("dp_cp")
    dp_rank = mesh["dp"].get_local_rank()
    out = {}
    for run in runs:
        model = build_model(spec_of(run), seed=0)
        layers = range(model.spec.num_layers)
        module = StageModule(model, 0, 1, layers) if run.endswith(STAGE) else model
        context = apply_context_parallel(module, Strategy(dp=dp, cp=cp), mesh)
        fully_shard(module, mesh=mesh["dp_cp"])  # averages gradients over dp x cp
        inputs, labels = batch(ROWS * dp, model.spec.vocab_size)
        count = (labels != IGNORE_INDEX).sum()  # label tokens of the global batch
        rows = slice(dp_rank * ROWS, (dp_rank + 1) * ROWS)
        inputs, labels, positions = context.shard(inputs[rows], labels[rows])
        with context.sharded():
            logits = module(inputs, positions) if module is not model else model(inputs)
            token_loss = token_cross_entropy(logits, labels)
            (token_loss * (dp * cp) / count).backward()
        torch.distributed.all_reduce(token_loss.detach_())
        # a stage shares the model's modules: the model's names reach its parameters
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        out[run] = ((token_loss / count).item(), grads)
    return out


def assert_matches_one_process(ranks: list[dict], runs: list[str], rows: int) -> None:
    # imported here: it imports the trainer, which the ranks need not load
    from distributed.trainer_gradients import assert_same_gradients

    for run in runs:
        want_loss, want = one_process(run, rows)
        for got in ranks:
            assert got[run][0] == pytest.approx(want_loss, rel=TOL), run
        grads = [without_zero_gradients(got[run][1]) for got in ranks]
        assert_same_gradients(grads, without_zero_gradients(want), TOL)
    with pytest.raises(AssertionError, match="gradient off"):  # the check sees a factor
        assert_same_gradients([{n: 1.01 * g for n, g in ranks[0][run][1].items()}], want, TOL)


def without_zero_gradients(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``grads`` less the K biases, after checking they are 0 up to rounding: a bias shared
    by all keys shifts a query's scores by one constant, which softmax ignores, so their
    exact gradient is 0 and a relative error of rounding noise would mean nothing."""
    zero = {n for n in grads if n.endswith("self_attn.k_proj.bias")}
    for name in zero:
        assert grads[name].norm() < 1e-7, name
    return {n: g for n, g in grads.items() if n not in zero}


def test_zigzag_split_balances_causal_work_and_keeps_true_positions():
    for cp in (1, 2, 3, 4):
        seq_len = 2 * cp * 5
        inputs = torch.arange(seq_len).expand(3, -1)
        held, work = [], set()
        for rank in range(cp):
            x, y, positions = shard_sequence(inputs, inputs + 1, rank, cp)
            assert positions.shape == (3, seq_len // cp)
            assert torch.equal(x, positions) and torch.equal(y, positions + 1)
            held += positions[0].tolist()
            work.add(int((positions[0] + 1).sum()))  # keys a causal query at p sees: p + 1
        assert sorted(held) == list(range(seq_len)), cp  # every token once
        assert work == {seq_len * (seq_len + 1) // (2 * cp)}, cp  # the same work per rank
    assert zigzag_positions(8, 1, 2).tolist() == [2, 3, 4, 5]  # chunks 1 and 2 of 4


def test_check_names_strategy_cp_and_the_allowed_values():
    check_context_parallel(4, 32)
    with pytest.raises(StrategyError, match=r"strategy.cp: cp=3 needs data.seq_len \(32\).*"
                       r"allowed: cp = 1, 2, 4, 8, 16"):  # fmt: skip
        check_context_parallel(3, 32)


def test_cp2_gives_the_one_process_loss_and_gradients():
    # RoPE + GQA, learned positions + tied embeddings, MoE, MLA (V head size != QK's)
    runs = ["tiny", "tiny-gpt", "tiny-moe", "tiny-deepseek", "tiny-gpt" + STAGE]
    ranks = run_ranks(cp_rank_step, runs, 1, 2)
    assert_matches_one_process(ranks, runs, ROWS)


def test_cp2_with_dp2_gives_the_one_process_loss_and_gradients():
    ranks = run_ranks(cp_rank_step, ["tiny"], 2, 2, world_size=4)
    assert_matches_one_process(ranks, ["tiny"], 2 * ROWS)


def test_a_slice_is_split_over_cp_as_a_sequence_of_its_own():
    """cp with slices: each rank's share of every slice (its zigzag chunks of it), the
    slices in order, at their true positions."""
    inputs = torch.arange(16).expand(2, -1)
    shards = [shard_sequence(inputs, inputs, rank, 2, cuts=(0, 8, 16)) for rank in range(2)]
    assert shards[0][0][0].tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert shards[1][0][0].tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    for ids, labels, positions in shards:
        assert torch.equal(ids, positions) and torch.equal(labels, ids)
