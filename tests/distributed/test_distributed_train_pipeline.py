"""``legato train`` with ``parallel.strategy`` pp=2 on 2 real gloo processes.

One spawn runs every pipeline case through ``Trainer`` (1F1B, interleaved, ZB-V, SVPP; a
resume into another layout; the data-parallel gradient sum of ``PipelineStep``), one
launch goes through the command line as a user runs it (an exact resume), and the
one-process references run in this process. Each case is compared with the one-process
data-parallel run on the same global batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_distributed_train import _launch, _losses
from trainer_gradients import assert_same_gradients, first_step_gradients, grad_norms, train_on_rank

from gloo_harness import run_ranks
from legato.models import build_model
from legato.parallel.job import Job
from legato.parallel.mesh import build_mesh
from legato.parallel.pipeline import token_cross_entropy
from legato.parallel.pipeline_step import PipelineStep
from legato.parallel.process_group import join
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy
from legato.train.config import load_config
from legato.train.trainer import Trainer, TrainResult

pytestmark = pytest.mark.distributed

# fp32: the pipeline sums the same terms in another order (per micro-batch, per slice, W
# as separate GEMMs), so losses differ by rounding only (seen: ~5e-7 on losses ~5).
LOSS_TOLERANCE = 1e-5
GRAD_RTOL = 1e-5  # each parameter's first-step gradient, 2-norm relative; the same rounding
# 4 layers (pp*vpp = 4 stages), tied embeddings (a copy on the first and the last stage)
MODEL = ("--model.overrides.num_layers=4", "--model.overrides.tied_embeddings=true")
BATCH = ("--train.global_batch_size=8", "--train.micro_batch_size=2")  # 4 micro-batches
CASES = {
    "1f1b": "pp=2",
    "interleaved": "pp=2,schedule=interleaved,vpp=2",
    "zb-v": "pp=2,schedule=zb-v",
    "svpp": "pp=2,schedule=svpp,vpp=2,slices=2",
}


def _args(small_train_args, run: Path, *extra: str) -> list[str]:
    return small_train_args(run, *MODEL, *BATCH, *extra)


def _gradient_sum_case(rank: int) -> dict:
    """PipelineStep on a (pp=1, dp=2) mesh: the halves of a batch with unequal ignored
    labels give the full batch's mean loss, gradients and norm."""
    spec = ModelSpec(
        name="dp", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
        ffn_hidden_size=48, vocab_size=61, seq_len=32,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, spec.vocab_size, (8, spec.seq_len), generator=generator)
    labels = torch.randint(0, spec.vocab_size, (8, spec.seq_len), generator=generator)
    labels[:4, :10] = -100  # rank 0's rows count fewer tokens
    reference = build_model(spec, seed=3)
    ref_loss = token_cross_entropy(reference(ids), labels) / (labels != -100).sum()
    ref_loss.backward()
    ref_norm = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])
    ctx = join("gloo", "cpu")
    job = Job(Strategy(pp=1, dp=2, mbs=2, gbs=8, dtype="fp32"), "fp32")
    ctx.mesh = build_mesh(job, "cpu")
    model = build_model(spec, seed=3)
    step = PipelineStep(model, job, ctx)
    rows = slice(4 * rank, 4 * rank + 4)
    loss = step.forward_backward(ids[rows], labels[rows])
    norm = step.clip_grad_norm(float("inf"))
    ref_grads = dict(reference.named_parameters())
    worst = max(
        (p.grad - ref_grads[name].grad).abs().max().item() for name, p in model.named_parameters()
    )
    return {"loss": loss, "ref_loss": ref_loss.item(), "norm": norm, "ref_norm": ref_norm.item(),
            "worst_grad_error": worst}  # fmt: skip


def _worker(rank: int, runs: dict[str, list[str]], gradient_runs: dict[str, list[str]]) -> dict:
    return {**train_on_rank(rank, runs, gradient_runs), "gradient_sum": _gradient_sum_case(rank)}


@pytest.fixture(scope="module")
def reference(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The one-process data-parallel run, a checkpoint at step 3."""
    run = tmp_path_factory.mktemp("reference") / "run"
    args = _args(small_train_args, run, "--parallel.nproc=1", "--checkpoint.every=3")
    return Trainer(load_config(None, args)).fit()


@pytest.fixture(scope="module")
def reference_gradients(small_train_args, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The one-process data-parallel run's first-step gradients."""
    run = tmp_path_factory.mktemp("reference-gradients") / "run"
    return first_step_gradients(_args(small_train_args, run, "--parallel.nproc=1"))


@pytest.fixture(scope="module")
def pipeline(reference, reference_gradients, small_train_args, tmp_path_factory) -> tuple:
    """Every case in one spawn: (root of the run dirs, rank 0's losses, both ranks'
    gradient-sum results, {case: both ranks' first-step gradients})."""
    root = tmp_path_factory.mktemp("pipeline")
    runs = {
        name: _args(small_train_args, root / name, f"--parallel.strategy={text}")
        for name, text in CASES.items()
    }
    runs["1f1b"].append("--checkpoint.every=3")
    step3 = reference.run_dir / "checkpoints" / "step_000003"
    runs["from-one-process"] = _args(
        small_train_args, root / "resumed", f"--parallel.strategy={CASES['interleaved']}",
        f"--checkpoint.resume={step3}",
    )  # fmt: skip
    gradient_runs = {
        name: _args(small_train_args, root / "gradients" / name, f"--parallel.strategy={text}")
        for name, text in CASES.items()
    }
    ranks = run_ranks(_worker, runs, gradient_runs)
    gradients = {name: [r["gradients"][name] for r in ranks] for name in CASES}
    return root, ranks[0]["losses"], [r["gradient_sum"] for r in ranks], gradients


@pytest.mark.parametrize("name", list(CASES))
def test_pipeline_schedule_matches_one_process(
    name: str, reference, reference_gradients, pipeline
) -> None:
    root, losses, _, gradients = pipeline
    assert losses[name] == pytest.approx(reference.losses, abs=LOSS_TOLERANCE, rel=0)
    assert _losses(root / name) == dict(zip(reference.steps, losses[name], strict=True))
    # the global norm over both pipeline ranks, the tied embedding counted once
    want = grad_norms(reference.run_dir)
    assert grad_norms(root / name) == pytest.approx(want, rel=1e-5)
    # every parameter's gradient on the rank whose stages hold it (the tied embedding's
    # on its first stage, after the last stage's share was added)
    assert_same_gradients(gradients[name], reference_gradients, GRAD_RTOL)


def test_one_process_checkpoint_resumes_in_a_pipeline(reference, pipeline) -> None:
    """DCP finds every parameter by name: an unsharded checkpoint loads into stages."""
    assert pipeline[1]["from-one-process"] == pytest.approx(
        reference.losses[3:], abs=LOSS_TOLERANCE, rel=0
    )


def test_pipeline_sums_gradients_over_data_parallel_replicas(pipeline) -> None:
    for result in pipeline[2]:
        assert result["loss"] == pytest.approx(result["ref_loss"], abs=1e-6)
        assert result["norm"] == pytest.approx(result["ref_norm"], rel=1e-5)
        assert result["worst_grad_error"] < 1e-6


def test_pipeline_resume_in_a_new_launch_is_exact(
    pipeline, small_train_args, tmp_path: Path
) -> None:
    root, losses, *_ = pipeline
    step3 = root / "1f1b" / "checkpoints" / "step_000003"
    meta = json.loads((step3 / "meta.json").read_text())
    assert meta["strategy"].startswith("dp=1,tp=1,pp=2")
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])  # each rank its stages
    run = tmp_path / "resumed"
    args = _args(small_train_args, run, f"--parallel.strategy={CASES['1f1b']}")
    proc = _launch([*args, f"--checkpoint.resume={step3}"])
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "pp=2 x dp=1, 1f1b" in proc.stdout
    assert list(_losses(run).values()) == losses["1f1b"][3:]  # bit for bit


def test_pipeline_checkpoint_resumes_in_one_process(
    reference, pipeline, small_train_args, tmp_path: Path
) -> None:
    """The stages saved by two ranks merge by name into one unsharded model."""
    step3 = pipeline[0] / "1f1b" / "checkpoints" / "step_000003"
    args = _args(small_train_args, tmp_path / "run", "--parallel.nproc=1")
    resumed = Trainer(load_config(None, [*args, f"--checkpoint.resume={step3}"])).fit()
    assert resumed.steps == [4, 5, 6]
    assert resumed.losses == pytest.approx(reference.losses[3:], abs=LOSS_TOLERANCE, rel=0)
