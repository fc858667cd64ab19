"""``legato finetune``: from a :class:`FinetuneConfig` to one saved PEFT adapter per task.

Everything a user can get wrong (the base model, its weights, the tokenizer, each task's
data file, target modules and sizes) is checked before the first step, so a bad task
stops the run before anything is written and adapters saved by earlier runs stay as they
are. Per-task step records go to ``<output_dir>/metrics.jsonl``. Under torchrun (or
``run.nproc`` > 1: ``legato.parallel.launch``) every process trains its share of each
batch (``lora/data_parallel.py``); rank 0 writes.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path
from typing import TextIO

import torch

from legato.data.tokenizer import Tokenizer, load_tokenizer
from legato.errors import CheckpointError, ConfigError, DataError
from legato.lora.adapter import AdapterShape, resolve_targets
from legato.lora.config import FinetuneConfig, ScheduleSection, TaskSection
from legato.lora.data_parallel import DataParallel
from legato.lora.packed_model import MultiLoraModel
from legato.lora.profile import (
    activation_bytes_per_token,
    memory_budget_bytes,
    probe_adapter,
    profile_cost,
)
from legato.lora.progress import TaskProgress
from legato.lora.scheduler import PackingScheduler
from legato.lora.task_data import TaskStream, read_task_stream
from legato.lora.trainer import MultiTaskTrainer, TaskStepRecord
from legato.models import build_model, load_safetensors
from legato.models.hf_checkpoint import INDEX_FILE, SINGLE_FILE
from legato.models.hf_folder import is_hf_folder
from legato.parallel.process_group import process_group
from legato.train.config import ModelSection, resolve_model
from legato.train.trained_model import is_legato_run, load_hf_folder, load_trained

_PROFILE_POINTS = 6


def load_base(config: FinetuneConfig, device: torch.device) -> tuple[MultiLoraModel, Tokenizer]:
    """The frozen model and the tokenizer of ``[base]``: a legato run's checkpoint (its
    spec, weights and tokenizer), a Hugging Face model folder (spec, weights and, unless
    run.tokenizer, tokenizer), HF-named safetensors, or random weights."""
    dtype = torch.bfloat16 if config.run.dtype == "bf16" else torch.float32
    weights = Path(config.base.weights).expanduser() if config.base.weights else None
    if weights is not None and weights.is_dir() and is_legato_run(weights):
        given = {
            "base.preset": config.base.preset,
            "base.overrides": config.base.overrides,
            "run.tokenizer": config.run.tokenizer,
        }
        for name, value in given.items():
            if value:
                raise ConfigError(
                    f"{name}: must be left empty when base.weights is a legato run "
                    f"({weights}); the model and its tokenizer come from the checkpoint"
                )
        trained = load_trained(weights, "base.weights", device=device, dtype=dtype)
        return MultiLoraModel(trained.model), trained.tokenizer
    if weights is not None and is_hf_folder(weights):
        if config.base.preset:
            raise ConfigError(
                f"base.preset: must be left empty when base.weights is a Hugging Face folder "
                f"({weights}); the model comes from its config.json"
            )
        spec = resolve_model(ModelSection(str(weights), config.base.overrides))
        folder = load_hf_folder(weights, "base.weights", spec=spec, tokenizer=config.run.tokenizer,
                                tokenizer_field="run.tokenizer", device=device, dtype=dtype)  # fmt: skip
        return MultiLoraModel(folder.model), folder.tokenizer
    tokenizer = load_tokenizer(config.run.tokenizer or "byte", where="run.tokenizer", trains=False)
    model = build_model(config.base.spec(), seed=config.run.seed, device=device, dtype=dtype)
    if weights is not None:
        if weights.is_dir() and not any((weights / n).is_file() for n in (SINGLE_FILE, INDEX_FILE)):
            raise CheckpointError(
                f"base.weights: {weights} is neither a legato run directory or checkpoint "
                f"nor a Hugging Face safetensors folder ({SINGLE_FILE} or {INDEX_FILE})"
            )
        try:
            load_safetensors(model, weights)
        except CheckpointError as exc:
            raise CheckpointError(f"base.weights: {exc}") from None
    return MultiLoraModel(model), tokenizer


def read_tasks(
    config: FinetuneConfig, model: MultiLoraModel, tokenizer: Tokenizer
) -> dict[str, TaskStream]:
    """Check every task against the model and tokenise its data, naming the task on error."""
    vocab = model.base.spec.vocab_size
    if tokenizer.vocab_size > vocab:
        raise ConfigError(
            f"run.tokenizer: {tokenizer.vocab_size} token ids do not fit the base model's "
            f"vocab_size {vocab}"
        )
    streams = {}
    for task in config.tasks:
        task.check_fits(model.base.spec, f"tasks.{task.name}")
        resolve_targets(model.base, task.target_modules, f"tasks.{task.name}")
        try:
            streams[task.name] = read_task_stream(task.data, tokenizer)
        except DataError as exc:
            raise DataError(f"tasks.{task.name}.data: {exc}") from None
    return streams


def build_packing_scheduler(
    section: ScheduleSection, model: MultiLoraModel, tasks: list[TaskSection]
) -> PackingScheduler:
    """Token budget from memory (or the config), speed profile from timing the fused step."""
    shapes = [AdapterShape(t.rank, t.alpha, 0.0, tuple(t.target_modules)) for t in tasks]
    probe = probe_adapter(model, shapes)
    longest = max(t.seq_len for t in tasks)
    demand = sum(t.batch_size * t.seq_len for t in tasks)
    if section.max_tokens_per_step:
        max_tokens = section.max_tokens_per_step
    else:
        device = model.base.output_weight().device
        budget = section.memory_budget_gb * 2**30 or memory_budget_bytes(device)
        max_tokens = int(budget // activation_bytes_per_token(model, probe, longest))
    max_tokens = max(1, min(max_tokens, demand))
    profile = None
    if section.profile and max_tokens >= longest:
        counts = [longest * 2**i for i in range(_PROFILE_POINTS) if longest * 2**i < max_tokens]
        profile = profile_cost(model, probe, longest, [*counts, max_tokens])
    return PackingScheduler(max_tokens, profile)


def finetune(config: FinetuneConfig, stream: TextIO | None = None) -> dict[str, Path]:
    """Train every task of ``config``; returns each task's adapter folder."""
    with process_group(device=config.run.device, where="run.device") as ctx:
        dp = DataParallel() if ctx.distributed else None
        return _finetune(config, ctx.device, dp, stream)


def _finetune(
    config: FinetuneConfig, device: torch.device, dp: DataParallel | None, stream: TextIO | None
) -> dict[str, Path]:
    torch.manual_seed(config.run.seed)
    model, tokenizer = load_base(config, device)
    streams = read_tasks(config, model, tokenizer)
    scheduler = build_packing_scheduler(config.schedule, model, config.tasks)
    main = dp is None or dp.rank == 0
    if dp is not None:
        scheduler = dp.same_on_all(scheduler)
    output = Path(config.run.output_dir).expanduser()
    trainer = MultiTaskTrainer(
        model,
        scheduler,
        output_dir=output if main else None,
        base_model=config.base.weights or config.base.preset or "tiny",
        data_parallel=dp,
    )
    for task in config.tasks:
        trainer.add_task(task, streams[task.name])
    output.mkdir(parents=True, exist_ok=True)
    progress = TaskProgress(config.run.log_every, stream if main else io.StringIO())
    saved: dict[str, Path] = {}
    metrics = output / "metrics.jsonl" if main else Path(os.devnull)
    with metrics.open("a", encoding="utf-8") as log:

        def on_step(record: TaskStepRecord) -> None:
            log.write(json.dumps(dataclasses.asdict(record)) + "\n")
            log.flush()
            progress.update(record)

        def on_finish(name: str, path: Path | None) -> None:
            if path is not None:  # None on ranks other than 0
                saved[name] = path
            progress.finish(name, path)

        trainer.on_step, trainer.on_finish = on_step, on_finish
        for task in config.tasks:
            progress.add(task.name, task.steps)
        progress.message(
            f"fine-tuning {len(config.tasks)} task(s) on {model.base.spec.name} ({device}); "
            f"fused-step budget {scheduler.max_tokens:,} tokens, target {scheduler.target_tokens:,}"
        )
        try:
            trainer.run()
        finally:
            progress.close()
    return saved
