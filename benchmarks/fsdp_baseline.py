"""Framework overhead: ``legato train`` against a plain loop, same model, same layout.

The baseline is what users write today (torchtitan's structure in ~50 lines, ``_worker``),
per ``--layout``: ``fsdp``, ``fully_shard`` on every block and the root; ``tp``, torch's
Megatron plan on every block (``ColwiseParallel`` q/k/v and gate/up, ``RowwiseParallel``
o and down), a vocabulary-parallel embedding and LM head and the loss under
``loss_parallel``; ``pp``, torch's own pipeline schedule (``torch.distributed.pipelining``
``Schedule1F1B``) over the model cut in two (legato's ``StageModule``, the model's first
and second half of blocks). Then AdamW, ``gbs / (mbs * dp)`` micro-batches accumulated,
gradient clipping to 1.0, one thread per core share, gloo; nothing else. It trains the
same ``legato.models`` module (the model is not what is compared) on random token ids
(the speed of a step does not depend on their values). legato runs the same job through
its CLI (``--parallel.strategy=zero=3``: FSDP2 resharded after forward; ``tp=<nproc>``;
``pp=<nproc>,schedule=1f1b``), the same batch, with its data pipeline, metrics, progress
and prediction (``--parallel.cluster=none`` only skips calibrating the host).

The two alternate ``--repeats`` times (so drift on a shared machine hits both); each run
reports its median tokens/s after ``WARMUP`` steps and the row gives the median over
repeats. Metric ``tokens_per_s``: ``value`` legato, ``baseline_value`` the plain loop,
``ratio = legato / plain`` (higher is better; the goal is >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import emit

WARMUP = 3


def _tensor_parallel(model, world: int) -> None:
    """torch's Megatron plan on a Llama-style model (torchtitan's ``apply_tp``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        plan = {f"self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
        plan |= {f"mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")}
        plan |= {"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()}
        parallelize_module(block, mesh, plan)
        block.self_attn.num_heads //= world
        block.self_attn.num_kv_heads //= world
    parallelize_module(model.model.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate()))
    parallelize_module(model.lm_head, mesh,
                       ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))  # fmt: skip


def _clip_mixed(model, max_norm: float) -> None:
    """Clip to the global norm over tensor-parallel DTensor and replicated gradients."""
    import torch
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    total = torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).norm()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)


def _pipeline(model, rank: int, world: int, micro: int):
    """torch's 1F1B schedule over this rank's half of the blocks."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from legato.parallel.pipeline.stages import StageModule

    per = model.spec.num_layers // world
    stage = StageModule(model, rank, world, range(rank * per, (rank + 1) * per))
    schedule = Schedule1F1B(
        PipelineStage(stage, rank, world, torch.device("cpu")), n_microbatches=micro,
        loss_fn=lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten()),
    )  # fmt: skip
    return stage, schedule


def _worker(layout: str, model_name: str, steps: int, gbs: int, mbs: int, out: str) -> None:
    """One rank of the plain loop (run by torchrun)."""
    import contextlib

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from legato.models import build_model
    from legato.specs import load_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    spec = load_model(model_name)
    model = build_model(spec, seed=0)
    schedule = None
    if layout == "tp":
        _tensor_parallel(model, world)
        dp, around_loss = 1, loss_parallel
    elif layout == "pp":
        model, schedule = _pipeline(model, rank, world, gbs // mbs)
        dp, around_loss = 1, contextlib.nullcontext
    else:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        dp, around_loss = world, contextlib.nullcontext
    # foreach kernels take one kind of tensor per group: DTensors apart from plain ones
    kinds: dict[bool, list] = {}
    for param in model.parameters():
        kinds.setdefault(isinstance(param, DTensor), []).append(param)
    groups = [{"params": params} for params in kinds.values()]
    optimizer = torch.optim.AdamW(groups, lr=3e-4, foreach=True)
    micro = gbs // (mbs * dp)
    generator = torch.Generator().manual_seed(rank if dp > 1 else 0)  # tp ranks: same rows
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        if schedule is not None:  # the schedule cuts the batch into its micro-batches
            tokens = torch.randint(0, spec.vocab_size, (gbs, spec.seq_len + 1), generator=generator)
            if rank == 0:
                schedule.step(tokens[:, :-1])
            else:
                schedule.step(target=tokens[:, 1:])
        for _ in range(micro if schedule is None else 0):
            tokens = torch.randint(0, spec.vocab_size, (mbs, spec.seq_len + 1), generator=generator)
            logits = model(tokens[:, :-1])
            with around_loss():
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / micro
                loss.backward()
        if layout == "tp":  # DTensor and plain gradients: torch's clip takes one kind
            _clip_mixed(model, 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def plain(layout: str, model: str, nproc: int, steps: int, gbs: int, mbs: int, tmp: Path) -> float:
    out = tmp / "plain.json"
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               "--standalone", __file__, "--worker", layout, model, str(steps), str(gbs),
               str(mbs), str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    times = json.loads(out.read_text())[WARMUP:]
    return gbs * load_seq(model) / statistics.median(times)


def legato(layout: str, model: str, nproc: int, steps: int, gbs: int, mbs: int, tmp: Path) -> float:
    run = tmp / f"legato-{time.monotonic_ns()}"
    strategy = {"tp": f"tp={nproc}", "pp": f"pp={nproc},schedule=1f1b"}.get(layout, "zero=3")
    command = [sys.executable, "-m", "legato.cli.main", "train", f"--model.preset={model}",
               f"--parallel.nproc={nproc}", f"--parallel.strategy={strategy}",
               "--parallel.cluster=none", f"--train.steps={steps}",
               f"--train.global_batch_size={gbs}", f"--train.micro_batch_size={mbs}",
               f"--train.log_every={steps}", "--checkpoint.every=0", f"--run.dir={run}"]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    times = [json.loads(line)["step_time_s"] for line in lines][WARMUP:]
    return gbs * load_seq(model) / statistics.median(times)


def load_seq(model: str) -> int:
    from legato.specs import load_model

    return load_model(model).seq_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 steps, 2 repeats")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layout", choices=("fsdp", "tp", "pp"), default="fsdp")
    parser.add_argument("--nproc", type=int, nargs="+", default=[2])
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (quick: 2)")
    parser.add_argument("--steps", type=int, default=None, help="default 20 (quick: 10)")
    parser.add_argument("--gbs", type=int, default=12)
    parser.add_argument("--mbs", type=int, default=6)
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 3)
    steps = args.steps or (10 if args.quick else 20)
    with tempfile.TemporaryDirectory(prefix="legato-fsdp-baseline-") as tmp:
        for nproc in args.nproc:
            ours, theirs = [], []
            for i in range(repeats):
                print(f"fsdp_baseline: {args.layout} {args.model} x{nproc}, repeat "
                      f"{i + 1}/{repeats}", file=sys.stderr)  # fmt: skip
                job = (args.layout, args.model, nproc, steps, args.gbs, args.mbs, Path(tmp))
                theirs.append(plain(*job))
                ours.append(legato(*job))
            emit(
                "fsdp_baseline",
                {"layout": args.layout, "model": args.model, "nproc": nproc, "gbs": args.gbs,
                 "mbs": args.mbs},
                "tokens_per_s", statistics.median(ours), f"plain_{args.layout}_loop",
                statistics.median(theirs), digits=1, ratio_digits=3,
                legato_runs=[round(x) for x in ours], plain_runs=[round(x) for x in theirs],
            )  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        layout, model, steps, gbs, mbs, out = sys.argv[2:8]
        _worker(layout, model, int(steps), int(gbs), int(mbs), out)
    else:
        main()
