"""`legato train` with 2 real gloo processes: FSDP2 equals 1 process, exact resume, bad input,
a clean stop on SIGTERM.

Every launch goes through the command line exactly as a user runs it (legato.parallel.launch
starting ``python -m legato.cli.main train`` twice), on a model small enough that one
launch takes a few seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_gradients import assert_same_gradients, first_step_gradients, grad_norms, train_on_rank

from gloo_harness import run_ranks
from legato.train.config import load_config
from legato.train.trainer import Trainer

pytestmark = pytest.mark.distributed

# Two processes sum their gradients in another order than one: fp32 rounding differs in
# the last bits and grows a little over steps; 1e-5 on losses ~5 is far below any real bug.
LOSS_TOLERANCE = 1e-5
# Each parameter's first-step gradient, 2-norm relative: fp32 differs by the
# reduction order's rounding only (seen: 5e-8); bf16 computes with 8-bit mantissas
# (2**-8 = 4e-3 per rounding) along another path than the one process (FSDP2's bf16
# parameters vs autocast; seen 7e-3); fp16 has 11-bit mantissas (seen 7e-4; an unscaled
# gradient would be 65536x off); FP8 rounds weights and activations to 3-bit e4m3
# mantissas (6% per rounding) in tiles that differ with the layout (seen: 0.11; under tp
# 0.15 with 64-wide layers, 0.11 with tile-aligned ones, where the bf16 rounding of another
# reduction order flips e4m3 roundings: tests/precision/test_precision_tensor_parallel.py
# checks the FP8 tp linears exact). A wrong gradient factor (a missed or doubled 1/world,
# an input gradient not summed over tp: 0.88) is off by >= 0.5.
GRAD_RTOL = {
    "fsdp": 1e-5,
    "ddp": 1e-5,
    "fsdp-bf16": 3e-2,
    "fsdp-fp16": 5e-3,
    "fsdp-fp8-gather": 0.25,
    "tp-fp8": 0.25,
}
# every step's norm against one fp32 process: rounding averages out over a whole model
# (seen: bf16 1.2e-3, FP8 4e-3 over 6 steps)
NORM_RTOL = {"ddp": 1e-5, "fsdp-bf16": 1e-2, "fsdp-fp16": 1e-2, "fsdp-fp8-gather": 3e-2}
MODES = {
    "fsdp": (),
    "ddp": ("--parallel.strategy=zero=0",),
    "fsdp-bf16": ("--train.dtype=bf16",),
    "fsdp-fp16": ("--train.dtype=fp16",),
    "fsdp-fp8-gather": ("--train.dtype=fp8", "--train.fp8_all_gather=true"),
    # FP8 linears on tensor-parallel shards (conftest's small model with 2 KV heads, tp=2)
    "tp-fp8": (
        "--model.overrides={num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2, "
        "ffn_hidden_size = 128, vocab_size = 258, seq_len = 64}",
        "--parallel.strategy=tp=2,sp=1",
        "--train.dtype=fp8",
    ),
}


def _launch(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "legato.cli.main", "train", f"--parallel.nproc={nproc}"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=240)


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def fsdp_run(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 steps in 2 processes, 2 micro-steps per rank, a checkpoint every 3 steps."""
    run = tmp_path_factory.mktemp("fsdp") / "run"
    args = small_train_args(run, "--train.micro_batch_size=2", "--checkpoint.every=3")
    proc = _launch([*args, "--checkpoint.keep=5"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"run directory: {run}") == 2
    return run


@pytest.fixture(scope="module")
def one_process(small_train_args, tmp_path_factory: pytest.TempPathFactory):
    """The same 6 steps in this process (one process, no group)."""
    run = tmp_path_factory.mktemp("one") / "run"
    return Trainer(load_config(None, small_train_args(run, "--parallel.nproc=1"))).fit()


@pytest.fixture(scope="module")
def gradients(small_train_args, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """First-step gradients of every mode: {mode: (one process, [rank 0, rank 1])}."""
    root = tmp_path_factory.mktemp("gradients")

    def runs(side: str) -> dict[str, list[str]]:
        return {
            mode: small_train_args(root / side / mode, "--train.micro_batch_size=2", *extra)
            for mode, extra in MODES.items()
        }

    # one process runs the mode without its layout: the fp32 reference serves FSDP and DDP
    ones = {
        mode: first_step_gradients([a for a in args if not a.startswith("--parallel.strategy")])
        for mode, args in runs("one").items()
        if mode != "ddp"
    }
    ones["ddp"] = ones["fsdp"]
    ranks = run_ranks(train_on_rank, {}, runs("two"))
    return {mode: (ones[mode], [r["gradients"][mode] for r in ranks]) for mode in MODES}


@pytest.mark.parametrize("mode", list(MODES))
def test_first_step_gradients_match_one_process(mode: str, gradients: dict) -> None:
    """Every parameter's full gradient (FSDP2 shards gathered) equals one process's."""
    one, ranks = gradients[mode]
    assert one and all(g.abs().sum() > 0 for g in one.values())
    assert_same_gradients(ranks, one, GRAD_RTOL[mode])


def test_two_processes_match_one(fsdp_run: Path, one_process) -> None:
    one = one_process
    two = _losses(fsdp_run)
    assert list(two) == one.steps == [1, 2, 3, 4, 5, 6]
    assert list(two.values()) == pytest.approx(one.losses, abs=LOSS_TOLERANCE, rel=0)
    want = grad_norms(one.run_dir)
    assert grad_norms(fsdp_run) == pytest.approx(want, rel=GRAD_RTOL["fsdp"])
    meta = json.loads((fsdp_run / "checkpoints" / "step_000006" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", "rng_rank0.json", "rng_rank1.json"} <= set(
        meta["files"]
    )


def test_resume_in_a_new_launch_is_exact(fsdp_run: Path, small_train_args, tmp_path: Path) -> None:
    step3 = fsdp_run / "checkpoints" / "step_000003"
    run = tmp_path / "resumed"
    args = small_train_args(run, "--train.micro_batch_size=2", f"--checkpoint.resume={step3}")
    proc = _launch(args)
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    resumed, full = _losses(run), _losses(fsdp_run)
    assert list(resumed) == [4, 5, 6]
    assert [resumed[s] for s in (4, 5, 6)] == pytest.approx([full[s] for s in (4, 5, 6)], abs=1e-6)


def test_corrupt_checkpoint_fails_with_one_line(
    fsdp_run: Path, small_train_args, tmp_path: Path
) -> None:
    ckpt = shutil.copytree(fsdp_run / "checkpoints" / "step_000003", tmp_path / "ckpt")
    (ckpt / ".metadata").write_bytes(b"\0" * (ckpt / ".metadata").stat().st_size)
    proc = _launch(small_train_args(tmp_path / "run", f"--checkpoint.resume={ckpt}"))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("legato: error:")
    assert f"checkpoint {ckpt}: .metadata is damaged (sha256 mismatch)" in errors[0]


@pytest.mark.parametrize(
    ("mode", "tolerance"),
    [
        ("ddp", LOSS_TOLERANCE),
        # slow: make test keeps their first-step gradients (test_first_step_gradients_...)
        pytest.param("fsdp-bf16", 0.05, marks=pytest.mark.slow),
        pytest.param("fsdp-fp16", 0.05, marks=pytest.mark.slow),
        pytest.param("fsdp-fp8-gather", 0.1, marks=pytest.mark.slow),
    ],
)
def test_other_modes_track_fsdp_fp32(
    mode: str, tolerance: float, fsdp_run: Path, one_process, small_train_args, tmp_path: Path
) -> None:
    """DDP gives the same losses; bf16 mixed precision (FSDP2's policy) and FP8 linears
    with FP8 weight all-gather stay close. Every step's gradient norm tracks one fp32
    process's (a norm, unlike a loss, scales with a wrong gradient factor)."""
    run = tmp_path / "run"
    proc = _launch(small_train_args(run, "--train.micro_batch_size=2", *MODES[mode]))
    assert proc.returncode == 0, proc.stderr
    got, want = _losses(run), _losses(fsdp_run)
    assert list(got.values()) == pytest.approx(list(want.values()), abs=tolerance, rel=0)
    norms = grad_norms(one_process.run_dir)
    assert grad_norms(run) == pytest.approx(norms, rel=NORM_RTOL[mode])


def test_two_process_checkpoint_resumes_in_one_process(
    fsdp_run: Path, small_train_args, tmp_path: Path
) -> None:
    """DCP reshards: the FSDP shards of 2 ranks load into one unsharded model."""
    step3 = fsdp_run / "checkpoints" / "step_000003"
    args = small_train_args(tmp_path / "run", "--parallel.nproc=1", f"--checkpoint.resume={step3}")
    resumed = Trainer(load_config(None, args)).fit()
    full = _losses(fsdp_run)
    assert resumed.steps == [4, 5, 6]
    assert resumed.losses == pytest.approx([full[s] for s in (4, 5, 6)], abs=LOSS_TOLERANCE, rel=0)


@pytest.fixture
def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (the workers' rendezvous store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_workers(args: list[str], port: int) -> list[subprocess.Popen[str]]:
    command = [sys.executable, "-m", "legato.cli.main", "train", *args]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def _wait(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=240) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


def test_sigterm_to_one_rank_stops_both_at_a_step_and_resumes_exactly(
    fsdp_run: Path, small_train_args, tmp_path: Path, free_port: int
) -> None:
    """The workers run ``legato train`` with torchrun's environment (the command's worker
    path, no launcher), so one rank alone can be signalled: the other learns of it in
    the step-boundary all-reduce. Resumed, the run has ``fsdp_run``'s losses exactly:
    same code, same layout, same order of operations."""
    run = tmp_path / "run"
    args = small_train_args(run, "--train.micro_batch_size=2", "--checkpoint.every=100")
    workers = _start_workers(args, free_port)
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and workers[0].poll() is None
        time.sleep(0.005)
    workers[1].send_signal(signal.SIGTERM)  # rank 1 only
    (code0, _, err0), (code1, _, err1) = _wait(workers)
    assert (code0, code1) == (130, 130), err0 + err1
    stop = max(_losses(run))
    assert 2 <= stop < 6
    step_dir = run / "checkpoints" / f"step_{stop:06d}"
    meta = json.loads((step_dir / "meta.json").read_text())
    assert meta["step"] == stop and {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])
    assert json.loads((run / "summary.json").read_text())["interrupted"] is True
    assert (run / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    lines = [line for line in (err0 + err1).splitlines() if line.strip()]
    assert lines == [
        f"legato: interrupted at step {stop}/{6}; checkpoint {step_dir} saved; "
        f"to resume, rerun with --run.dir={run}"
    ]

    resumed = _wait(_start_workers(args, free_port))  # the same command: resume = auto
    assert [code for code, _, _ in resumed] == [0, 0], resumed[0][2]
    assert f"resumed from {step_dir} (step {stop})" in resumed[0][1]
    assert _losses(run) == _losses(fsdp_run)  # every step, bit for bit
