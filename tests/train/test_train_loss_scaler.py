"""fp16's dynamic loss scaling: the schedule, one skip decision for every rank, and a
trainer step that overflows changes no weight."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn

from gloo_harness import run_ranks
from legato.models import build_model
from legato.train.config import load_config
from legato.train.loss_scaler import LossScaler
from legato.train.trainer import Trainer


def test_scale_halves_on_overflow_and_doubles_after_a_clean_run() -> None:
    scaler = LossScaler(scale=8.0, growth_interval=3)
    scaler.update(False)
    assert (scaler.scale, scaler.clean_steps) == (4.0, 0)
    for _ in range(2):
        scaler.update(True)
    assert scaler.scale == 4.0
    scaler.update(True)
    assert (scaler.scale, scaler.clean_steps) == (8.0, 0)
    floor = LossScaler(scale=1.0)
    floor.update(False)
    assert floor.scale == 1.0
    state = scaler.state_dict()
    fresh = LossScaler()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state


def test_unscale_divides_the_gradients() -> None:
    param = nn.Parameter(torch.zeros(3))
    param.grad = torch.tensor([4.0, 8.0, -16.0])
    assert LossScaler(scale=4.0).unscale([param], torch.device("cpu"))
    assert param.grad.tolist() == [1.0, 2.0, -4.0]


def _one_rank_overflows(rank: int) -> bool:
    param = nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([1.0, float("inf") if rank == 1 else 2.0])
    finite = LossScaler(scale=2.0).unscale([param], torch.device("cpu"))
    assert dist.get_world_size() == 2
    return finite


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank() -> None:
    assert run_ranks(_one_rank_overflows, world_size=2) == [False, False]


def test_an_overflowing_step_is_skipped_logged_and_resumed(small_train_args, tmp_path) -> None:
    """A scale no fp16 gradient survives: the step leaves every weight as initialised,
    logs no norm and the halved scale, which the checkpoint carries to the next launch."""
    run = tmp_path / "run"
    args = small_train_args(run, "--train.dtype=fp16", "--train.steps=1", "--parallel.nproc=1",
                            "--checkpoint.every=1")  # fmt: skip
    trainer = Trainer(load_config(None, args))
    trainer.loss_scaler.scale = 2.0**60
    trainer.fit()
    initial = build_model(trainer.spec, seed=trainer.config.train.seed, device="cpu")
    for (name, want), got in zip(initial.state_dict().items(), trainer.model.state_dict().values(),
                                 strict=True):  # fmt: skip
        assert torch.equal(got, want), name
    Trainer(load_config(None, [*args, "--train.steps=2"])).fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["grad_norm"] for r in records] == [None, None]
    assert [r["loss_scale"] for r in records] == [2.0**59, 2.0**58]


def test_fp16_steps_train(small_train_args, tmp_path) -> None:
    """At the default scale the steps apply (a norm each) and the loss falls."""
    args = small_train_args(tmp_path / "run", "--train.dtype=fp16", "--parallel.nproc=1")
    result = Trainer(load_config(None, args)).fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert all(r["grad_norm"] is not None and r["loss_scale"] == 2.0**16 for r in records)
    assert result.losses[-1] < result.losses[0]
