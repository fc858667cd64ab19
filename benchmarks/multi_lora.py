"""Multi-LoRA fine-tuning: k tasks fused on one backbone vs the same tasks one at a time.

For k = 1, 2, 4, 8 LoRA tasks (different ranks, sequence lengths and target layers) on the
same frozen base model, each task trains ``--steps`` optimizer steps of ``batch`` x
``seq_len`` tokens, three ways, interleaved within every repeat:

* ``fused``: legato's multi-task trainer, every task's whole batch in each fused step;
* ``legato_sequential``: the same trainer with one task at a time (legato's single-task path);
* ``hf_peft_sequential``: Hugging Face PEFT on a transformers ``LlamaForCausalLM`` built from
  a ``LlamaConfig`` with the same weights (random, no download), one adapter per task
  (``add_adapter``), trained one at a time (``set_adapter``) with its own AdamW, the way
  PEFT trains several adapters.

Only the training steps are timed; building trainers, adapters and optimizers is not.
Metrics, median over repeats: ``tokens_per_s`` (higher is better) and
``peak_memory_bytes`` (lower is better), the memory a run needs on top of the resident
frozen base model: on a GPU the allocator's peak minus what was allocated before the run;
on a CPU (no allocator statistics) the live adapters with their gradients and AdamW moments
plus the bytes autograd saves for backward in one step, the largest over the run's steps,
counted the same way for all three. ``ratio = value / baseline_value`` with ``value`` the
fused run. Published anchor: MuxTune reports up to 2.33x the throughput of HF-PEFT / NeMo /
single-LoRA baselines (on GPUs). ``--quick``: a smaller model and fewer steps, < 1 minute.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from legato.lora import MultiLoraModel, MultiTaskTrainer, PackingScheduler, TaskSection
from legato.lora.hf_interop import to_hf_llama
from legato.lora.profile import saved_tensor_bytes
from legato.lora.task_data import TaskSampler, TaskStream
from legato.models import build_model
from legato.specs.model import ModelSpec
from legato.specs.registry import load_model
from report import emit

RANKS = (8, 16, 4, 32)
TARGETS = (("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"))
MODES = ("fused", "legato_sequential", "hf_peft_sequential")


@dataclass(frozen=True)
class Setup:
    spec: ModelSpec
    seq_lens: tuple[int, ...]
    batch: int
    steps: int
    device: torch.device


def _tasks(k: int, setup: Setup) -> list[TaskSection]:
    return [
        TaskSection(
            name=f"task{i}",
            data="synthetic",
            rank=RANKS[i % len(RANKS)],
            alpha=2.0 * RANKS[i % len(RANKS)],
            target_modules=list(TARGETS[i % len(TARGETS)]),
            seq_len=setup.seq_lens[i % len(setup.seq_lens)],
            batch_size=setup.batch,
            steps=setup.steps,
            lr=1e-4,
            seed=i,
        )
        for i in range(k)
    ]


def _stream(seed: int, vocab: int, n: int = 20_000) -> TaskStream:
    """Random single-example windows: plain causal attention in every framework."""
    tokens = np.random.default_rng(seed).integers(0, vocab, n)
    return TaskStream(tokens, np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64))


@dataclass(frozen=True)
class Unit:
    """Something that trains by ``step()`` until ``done()``; ``trainable()`` lists its live
    adapter tensors (for the CPU memory count)."""

    step: Callable[[], object]
    done: Callable[[], bool]
    trainable: Callable[[], list[torch.Tensor]]


def _legato_units(
    model: MultiLoraModel, groups: list[list[TaskSection]], scheduler: PackingScheduler, vocab: int
) -> list[Unit]:
    """One trainer per group of tasks (all tasks of a group are fused)."""
    units = []
    for group in groups:
        trainer = MultiTaskTrainer(model, scheduler)
        for t in group:
            trainer.add_task(t, _stream(t.seed, vocab))
        units.append(
            Unit(
                trainer.step,
                lambda trainer=trainer: trainer.done,
                lambda trainer=trainer: [
                    p for r in trainer.runs.values() for p in r.adapter.parameters()
                ],
            )
        )
    return units


def _peft_units(base, tasks: list[TaskSection], device: torch.device) -> list[Unit]:
    """HF PEFT's multi-adapter pattern: one LlamaForCausalLM, an adapter per task, the
    active one trained with its own AdamW (``set_adapter`` switches, freezing the others)."""
    from peft import LoraConfig, get_peft_model

    def config(t: TaskSection) -> LoraConfig:
        modules = list(t.target_modules)
        return LoraConfig(r=t.rank, lora_alpha=t.alpha, lora_dropout=0.0, target_modules=modules)

    model = get_peft_model(to_hf_llama(base), config(tasks[0]), adapter_name=tasks[0].name)
    for t in tasks[1:]:
        model.add_adapter(t.name, config(t))
    model.train()
    units = []
    for t in tasks:
        params = [p for n, p in model.named_parameters() if f".{t.name}." in n]
        optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
        sampler = TaskSampler(_stream(t.seed, base.spec.vocab_size), t.seq_len, t.seed)
        count = [0]

        def step(t=t, optimizer=optimizer, sampler=sampler, count=count) -> None:
            if count[0] == 0:
                model.set_adapter(t.name)
            ids = sampler.next(t.batch_size).input_ids.to(device)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            count[0] += 1

        units.append(
            Unit(step, lambda t=t, count=count: count[0] == t.steps, lambda params=params: params)
        )
    return units


def prepare(mode: str, model: MultiLoraModel, tasks: list[TaskSection], setup: Setup) -> list[Unit]:
    vocab = setup.spec.vocab_size
    if mode == "fused":  # every task's whole batch in each fused step
        budget = sum(t.batch_size * t.seq_len for t in tasks)
        return _legato_units(model, [tasks], PackingScheduler(budget), vocab)
    if mode == "legato_sequential":
        return _legato_units(model, [[t] for t in tasks], PackingScheduler(10**9), vocab)
    return _peft_units(model.base, tasks, setup.device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_timed(units: list[Unit], device: torch.device) -> tuple[float, int | None]:
    """(seconds, CUDA bytes above what was allocated before, or None on CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    _sync(device)
    begin = time.perf_counter()
    for unit in units:
        while not unit.done():
            unit.step()
    _sync(device)
    seconds = time.perf_counter() - begin
    if device.type != "cuda":
        return seconds, None
    return seconds, torch.cuda.max_memory_allocated(device) - resident


def counted_bytes(units: list[Unit]) -> int:
    """CPU memory count of one step per unit: live adapter tensors (with gradient and two
    AdamW moments) plus the bytes autograd saves for backward; the largest unit."""
    peak = 0
    for unit in units:
        _, saved = saved_tensor_bytes(unit.step)
        live = sum(t.numel() * t.element_size() for t in unit.trainable())
        peak = max(peak, 4 * live + saved)
    return peak


def bench_k(k: int, model: MultiLoraModel, setup: Setup, repeats: int) -> None:
    tasks = _tasks(k, setup)
    tokens = sum(t.steps * t.batch_size * t.seq_len for t in tasks)
    speeds: dict[str, list[float]] = {m: [] for m in MODES}
    peaks: dict[str, list[int]] = {m: [] for m in MODES}
    for _ in range(repeats):
        for mode in MODES:
            seconds, peak = train_timed(prepare(mode, model, tasks, setup), setup.device)
            speeds[mode].append(tokens / seconds)
            peaks[mode].append(
                peak if peak is not None else counted_bytes(prepare(mode, model, tasks, setup))
            )
    case = {
        "k": k,
        "model": setup.spec.name,
        "device": setup.device.type,
        "ranks": [t.rank for t in tasks],
        "seq_lens": [t.seq_len for t in tasks],
        "batch": setup.batch,
        "steps": setup.steps,
        "repeats": repeats,
    }
    fused_speed = statistics.median(speeds["fused"])
    fused_peak = statistics.median(peaks["fused"])
    for baseline in MODES[1:]:
        for metric, value, runs in (
            ("tokens_per_s", fused_speed, speeds),
            ("peak_memory_bytes", fused_peak, peaks),
        ):
            base = statistics.median(runs[baseline])
            emit("multi_lora", case, metric, value, baseline, base, digits=3, ratio_digits=4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, few steps (< 1 min)")
    parser.add_argument("--repeats", type=int, default=None, help="default 3")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per task (default 6, quick 4)"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--ks", default="1,2,4,8", help="comma-separated task counts")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads; 0 = torch's default"
    )
    args = parser.parse_args(argv)
    if args.threads:  # one thread: CPU timings that hold up on a shared machine
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    if args.quick:
        spec = load_model("tiny").with_(
            name="tiny-quick", hidden_size=64, num_layers=2, vocab_size=1024
        )
        setup = Setup(spec, (32, 64, 48, 96), 4, args.steps or 4, device)
    else:
        setup = Setup(load_model("tiny"), (64, 128, 96, 256), 4, args.steps or 6, device)
    repeats = args.repeats or 3
    torch.manual_seed(0)
    model = MultiLoraModel(build_model(setup.spec, seed=0, device=device))
    for mode in MODES:  # first-call costs (kernels, allocator) out of the measurement
        train_timed(prepare(mode, model, _tasks(2, setup), setup), device)
    for k in (int(x) for x in args.ks.split(",")):
        bench_k(k, model, setup, repeats)


if __name__ == "__main__":
    main()
