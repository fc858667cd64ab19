"""`legato train` with expert parallelism on 2 gloo processes: EP (plain, Comet, and with
activation swap plus the chunked loss under FSDP2) equals one process on the same global
batch, and an EP checkpoint resumes exactly.

The model is a tiny Mixtral-style MoE (2 layers, hidden 32, 4 experts, top-2, seq 64).
Each rank's 4 rows are one micro-batch, as are the one process's 2 micro-batches, so
the load-balance loss (train.moe_aux_loss_coef = 0.01, the default) is computed over the
same token groups in both layouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_gradients import assert_same_gradients, first_step_gradients, grad_norms, train_on_rank

from gloo_harness import run_ranks
from legato.train.config import load_config
from legato.train.trainer import Trainer, TrainResult

pytestmark = pytest.mark.distributed

# fp32 rounding of the all-to-all/gradient-reduction order only; losses are ~5.
LOSS_TOLERANCE = 1e-5
# gradients (each parameter's, 2-norm relative) and every step's gradient norm: the same
# rounding; a wrong gradient factor is off by >= 0.5
GRAD_RTOL = 1e-5
TINY_MOE = (
    "{num_layers = 2, hidden_size = 32, num_heads = 2, num_kv_heads = 1, ffn_hidden_size = 64, "
    "vocab_size = 258, seq_len = 64, moe = {num_experts = 4, top_k = 2, "
    "expert_ffn_hidden_size = 64}}"
)
COMET = "--parallel.strategy=ep=2,moe_overlap=comet,moe_chunks=2,moe_groups=2"
EP_MODES = {
    "plain": "--parallel.strategy=ep=2",
    "comet": COMET,
    "swap-chunked-loss": "--parallel.strategy=ep=2,swap=1,loss_chunk=96",
}


def _args(small_train_args, run: Path, *extra: str) -> list[str]:
    return small_train_args(
        run, "--model.preset=tiny-moe", f"--model.overrides={TINY_MOE}", "--train.steps=4", *extra
    )


def _launch(args: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "legato.cli.main", "train", "--parallel.nproc=2"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=240)


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


@pytest.fixture(scope="module")
def one_process(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    run = tmp_path_factory.mktemp("one") / "run"
    return Trainer(load_config(None, _args(small_train_args, run, "--parallel.nproc=1"))).fit()


@pytest.fixture(scope="module")
def gradients(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list]:
    """First-step gradients: one process, and every EP mode's on both ranks."""
    root = tmp_path_factory.mktemp("gradients")
    one = first_step_gradients(_args(small_train_args, root / "one", "--parallel.nproc=1"))
    runs = {name: _args(small_train_args, root / name, s) for name, s in EP_MODES.items()}
    return one, run_ranks(train_on_rank, {}, runs)


@pytest.mark.parametrize("mode", list(EP_MODES))
def test_ep_first_step_gradients_match_one_process(mode: str, gradients) -> None:
    """Experts (DTensors on the EP mesh) and the FSDP2-sharded dense part, by name."""
    one, ranks = gradients
    assert any(".experts." in name for name in one)
    assert_same_gradients([r["gradients"][mode] for r in ranks], one, GRAD_RTOL)


@pytest.fixture(scope="module")
def comet_run(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("comet") / "run"
    proc = _launch(
        _args(small_train_args, run, COMET, "--checkpoint.every=2", "--checkpoint.keep=3")
    )
    assert proc.returncode == 0, proc.stderr
    assert "ep=2 comet 2x2" in proc.stdout
    return run


def test_comet_ep_matches_one_process(comet_run: Path, one_process: TrainResult) -> None:
    losses = one_process.losses
    assert len(losses) == 4 and losses[0] != losses[-1]
    assert _losses(comet_run) == pytest.approx(losses, abs=LOSS_TOLERANCE, rel=0)
    assert grad_norms(comet_run) == pytest.approx(grad_norms(one_process.run_dir), rel=GRAD_RTOL)


def test_plain_ep_matches_one_process(
    small_train_args, one_process: TrainResult, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = _launch(_args(small_train_args, run, EP_MODES["plain"]))
    assert proc.returncode == 0, proc.stderr
    assert _losses(run) == pytest.approx(one_process.losses, abs=LOSS_TOLERANCE, rel=0)
    assert grad_norms(run) == pytest.approx(grad_norms(one_process.run_dir), rel=GRAD_RTOL)


def test_ep_checkpoint_resumes_exactly(comet_run: Path, small_train_args, tmp_path: Path) -> None:
    """Expert weights and moments are DTensors on the EP mesh; DCP saves and reloads them."""
    step2 = comet_run / "checkpoints" / "step_000002"
    run = tmp_path / "resumed"
    proc = _launch(_args(small_train_args, run, COMET, f"--checkpoint.resume={step2}"))
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    assert _losses(run) == pytest.approx(_losses(comet_run)[2:], abs=1e-6, rel=0)


def test_ep_with_swap_and_chunked_loss_matches_one_process(
    small_train_args, one_process: TrainResult, tmp_path: Path
) -> None:
    """FSDP2 gathers the root (LM head) around the chunked loss's ``hidden_states`` call."""
    run = tmp_path / "run"
    proc = _launch(_args(small_train_args, run, EP_MODES["swap-chunked-loss"]))
    assert proc.returncode == 0, proc.stderr
    assert _losses(run) == pytest.approx(one_process.losses, abs=LOSS_TOLERANCE, rel=0)
    assert grad_norms(run) == pytest.approx(grad_norms(one_process.run_dir), rel=GRAD_RTOL)
