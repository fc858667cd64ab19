"""Uneven local batches (``train.batch_split``) train exactly what the even split trains.

On 2 real gloo ranks: local batches 5 and 3 give every parameter the gradient of 4 and 4
and of one process with the whole batch of 8, under DDP (zero=0) and FSDP2 (zero=3), with
micro_batch_size 2 (3 micro-batches: chunks 2+2+1 and 1+1+1); and those of 4 and 4 with
expert parallelism (ep=2, MoE). Re-splitting while ``fit()``
runs (``Trainer.set_batch_split`` from another thread) and resuming a checkpoint with
another split keep the even run's per-step losses.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from torch.optim.optimizer import register_optimizer_step_pre_hook
from trainer_gradients import GRADIENT_ARGS, assert_same_gradients, first_step_gradients

from gloo_harness import run_ranks
from legato.train.config import load_config
from legato.train.trainer import Trainer

pytestmark = pytest.mark.distributed

# fp32: the layouts differ only in the order the same token losses are summed (chunks of
# other sizes, other ranks); seen <= 1.3e-7 relative (per parameter, in the 2-norm)
RTOL = 1e-6
LOSS_RTOL = 1e-5  # losses over 4 steps of AdamW (seen: equal to the last bit)
STEPS = 2
GRADIENT_ROWS = {
    f"zero={zero} {split}": (zero, split) for zero in (0, 3) for split in ([4, 4], [5, 3])
}
# expert parallelism exchanges each micro-batch's tokens: uneven ranks send uneven counts
# (no load-balance loss: a per-micro-batch statistic, it depends on the split)
MOE = (
    "--model.preset=tiny-moe",
    "--model.overrides={num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2, "
    "vocab_size = 259}",
    "--parallel.strategy=ep=2",
    "--train.moe_aux_loss_coef=0",
)
MOE_ROWS = {f"moe ep=2 {split}": split for split in ([4, 4], [5, 3])}


def _args(small_train_args, run: Path, *extra: str) -> list[str]:
    return small_train_args(run, "--parallel.cluster=none", *extra)


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _resplit(args: list[str], after_step: int, split: list[int], rank: int) -> list[int]:
    """Train with ``args``; once the optimizer reaches step ``after_step``, another thread
    asks this rank's trainer for ``split`` (rank 1 asks for it reversed, which rank 0's
    call overrides). Returns the split the trainer ended with."""
    trainer, steps = Trainer(load_config(None, args)), []
    wanted = split if rank == 0 else split[::-1]

    def switch(*_: object) -> None:
        steps.append(len(steps) + 1)
        if steps[-1] == after_step:
            caller = threading.Thread(target=trainer.set_batch_split, args=(wanted,))
            caller.start()
            caller.join()

    handle = register_optimizer_step_pre_hook(switch)
    try:
        trainer.fit()
    finally:
        handle.remove()
    return trainer.batch_split


def _on_rank(rank: int, gradient_runs: dict, resplit: list, loss_runs: dict) -> dict:
    """A ``run_ranks`` worker: the gradient runs, then the even and the resumed runs (in
    that order: the resume reads the even run's checkpoint), then the re-split run."""
    return {
        "gradients": {name: first_step_gradients(a, STEPS) for name, a in gradient_runs.items()},
        "losses": {
            name: Trainer(load_config(None, a)).fit().losses for name, a in loss_runs.items()
        },
        "resplit": _resplit(*resplit, rank),
    }


@pytest.fixture(scope="module")
def runs(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("batch_split")
    small = ("--train.micro_batch_size=2", *GRADIENT_ARGS)
    one = first_step_gradients(
        _args(small_train_args, root / "one", "--parallel.nproc=1", *small), STEPS
    )
    gradient_runs = {
        name: _args(
            small_train_args,
            root / name,
            *small,
            f"--parallel.strategy=zero={zero}",
            f"--train.batch_split={split}",
        )
        for name, (zero, split) in GRADIENT_ROWS.items()
    } | {
        name: _args(small_train_args, root / name, *small, *MOE, f"--train.batch_split={split}")
        for name, split in MOE_ROWS.items()
    }
    # mbs=4: [4, 4] runs 1 micro-batch per step, [6, 2] runs 2 (3+3 and 1+1)
    fsdp = ("--parallel.strategy=zero=3", "--train.micro_batch_size=4", "--train.steps=4")
    even = root / "even"
    loss_runs = {
        "even": _args(small_train_args, even, *fsdp, "--checkpoint.every=2"),
        "resumed": _args(
            small_train_args,
            root / "resumed",
            *fsdp,
            "--train.batch_split=[6,2]",
            f"--checkpoint.resume={even / 'checkpoints' / 'step_000002'}",
        ),
    }
    resplit = (_args(small_train_args, root / "resplit", *fsdp), 2, [6, 2])
    ranks = run_ranks(_on_rank, gradient_runs, resplit, loss_runs, timeout_s=240)
    return {"root": root, "one": (one, _log(root / "one")), "ranks": ranks}


@pytest.mark.parametrize("row", list(GRADIENT_ROWS))
def test_uneven_split_has_the_gradients_of_one_process(row: str, runs: dict) -> None:
    want, want_log = runs["one"]
    assert_same_gradients([r["gradients"][row] for r in runs["ranks"]], want, RTOL)
    log = _log(runs["root"] / row)
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in want_log], rel=RTOL)
    assert [r["grad_norm"] for r in log] == pytest.approx(
        [r["grad_norm"] for r in want_log], rel=RTOL
    )
    assert [r["batch_split"] for r in log] == [GRADIENT_ROWS[row][1]] * STEPS


@pytest.mark.parametrize("layout", ["zero=0", "zero=3", "moe ep=2"])
def test_uneven_split_has_the_gradients_of_the_even_split(layout: str, runs: dict) -> None:
    even = runs["ranks"][0]["gradients"][f"{layout} [4, 4]"]
    uneven = [r["gradients"][f"{layout} [5, 3]"] for r in runs["ranks"]]
    assert_same_gradients(uneven, even, RTOL)


def test_resplit_between_steps_keeps_the_even_losses(runs: dict) -> None:
    even = [r["loss"] for r in _log(runs["root"] / "even")]
    log = _log(runs["root"] / "resplit")
    assert [r["batch_split"] for r in log] == [[4, 4], [4, 4], [6, 2], [6, 2]]
    assert [r["loss"] for r in log] == pytest.approx(even, rel=LOSS_RTOL)
    assert [r["resplit"] for r in runs["ranks"]] == [[6, 2], [6, 2]]  # rank 0's call won


def test_resume_with_another_split_serves_the_same_samples(runs: dict) -> None:
    even = [r["loss"] for r in _log(runs["root"] / "even")]
    resumed = _log(runs["root"] / "resumed")
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["batch_split"] for r in resumed] == [[6, 2], [6, 2]]
    assert [r["loss"] for r in resumed] == pytest.approx(even[2:], rel=LOSS_RTOL)
    assert runs["ranks"][0]["losses"]["resumed"] == runs["ranks"][1]["losses"]["resumed"]
