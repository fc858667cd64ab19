"""The multi-task LoRA trainer: many adapters, one frozen backbone, one backward per step.

Each *fused step* runs the rows the packing scheduler picked (several tasks, each a number
of its sequences) through :class:`MultiLoraModel` in one forward and one backward. A task's
loss is its summed token loss divided by the number of trained tokens in its whole
optimizer-step batch, so when its batch is split over several fused steps the gradients
accumulate to exactly the batch mean. When a task's batch is complete, its own AdamW takes
a step with its own learning-rate schedule; after its last step the adapter is saved (PEFT
format, atomically) and the task leaves. Tasks may join at a given fused step or be added
and removed at any time between steps; the others keep running.

With a :class:`DataParallel` over a process group, each rank trains on its share of every
batch and the tasks' gradients are summed over ranks before their optimizer steps (see
``lora/data_parallel.py``); on one process this is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from legato.errors import ConfigError, DataError
from legato.lora.adapter import AdapterShape, LoraAdapter
from legato.lora.config import TaskSection
from legato.lora.data_parallel import DataParallel
from legato.lora.packed_model import MultiLoraModel, TaskRows
from legato.lora.peft_io import save_adapter
from legato.lora.scheduler import PackingScheduler, TaskDemand
from legato.lora.task_data import IGNORE, Sequences, TaskSampler, TaskStream
from legato.train.optim import lr_factor


@dataclass(frozen=True)
class TaskStepRecord:
    """One optimizer step of one task, as shown and logged."""

    task: str
    step: int  # 1-based
    total_steps: int
    loss: float  # mean over the batch's trained tokens
    lr: float
    tokens: int  # packed tokens in the batch
    seconds: float  # wall time since the task's previous step


class _TaskRun:
    """A task while it trains: adapter, optimizer, data and the current batch's progress."""

    def __init__(
        self, cfg: TaskSection, adapter: LoraAdapter, sampler: TaskSampler, dp: DataParallel
    ) -> None:
        self.cfg = cfg
        self.dp = dp
        self.local_batch = dp.local_batch(cfg.batch_size, f"tasks.{cfg.name}")
        self.adapter = adapter
        self.sampler = sampler
        self.optimizer = torch.optim.AdamW(
            adapter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.step = 0
        self.batch: Sequences | None = None
        self.cursor = 0
        self.normalizer = 1
        self.loss_sum: torch.Tensor | float = 0.0  # summed token loss of the current batch
        self.last_time = time.perf_counter()

    def next_rows(self, count: int, device: torch.device) -> Sequences:
        if self.batch is None:
            batch = self.sampler.next(self.cfg.batch_size)  # on the CPU: no device sync
            self.normalizer = max(1, int((batch.labels != IGNORE).sum()))  # global batch
            batch = batch.rows(*self.dp.shard(self.cfg.batch_size))
            self.batch, self.cursor, self.loss_sum = batch.to(device), 0, 0.0
        rows = self.batch.rows(self.cursor, self.cursor + count)
        self.cursor += count
        return rows

    def demand(self) -> TaskDemand:
        left = self.local_batch - (self.cursor if self.batch is not None else 0)
        later = (self.cfg.steps - self.step - 1) * self.local_batch
        return TaskDemand(self.cfg.name, self.cfg.seq_len, left, (left + later) * self.cfg.seq_len)

    @property
    def batch_done(self) -> bool:
        return self.batch is not None and self.cursor == self.local_batch


UpdateHook = Callable[[str, int, LoraAdapter], None]


class MultiTaskTrainer:
    """Trains the added tasks until each has taken its ``steps`` optimizer steps."""

    def __init__(
        self,
        model: MultiLoraModel,
        scheduler: PackingScheduler,
        *,
        output_dir: str | Path | None = None,
        base_model: str = "",
        on_step: Callable[[TaskStepRecord], None] | None = None,
        on_finish: Callable[[str, Path | None], None] | None = None,
        before_update: UpdateHook | None = None,
        data_parallel: DataParallel | None = None,
    ) -> None:
        self.model = model
        self.scheduler = scheduler
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.base_model = base_model
        self.on_step = on_step
        self.on_finish = on_finish
        self.before_update = before_update
        self.dp = data_parallel or DataParallel(fused_groups=1)
        self.device = model.base.output_weight().device
        self.fused_steps = 0
        self.runs: dict[str, _TaskRun] = {}  # joined and training
        self.waiting: dict[str, _TaskRun] = {}  # added, joining at cfg.join_at
        self.finished: dict[str, LoraAdapter] = {}
        self.history: dict[str, list[TaskStepRecord]] = {}

    def add_task(self, cfg: TaskSection, stream: TaskStream) -> None:
        """Check and register a task; any problem is one error naming the task and field."""
        where = f"tasks.{cfg.name}"
        cfg.validate(where)
        spec = self.model.base.spec
        if cfg.name in self.runs or cfg.name in self.waiting or cfg.name in self.finished:
            raise ConfigError(f"{where}.name: a task named {cfg.name!r} already exists")
        cfg.check_fits(spec, where)
        if cfg.seq_len > self.scheduler.max_tokens:
            raise ConfigError(
                f"{where}.seq_len: one sequence of {cfg.seq_len} tokens exceeds the fused-step "
                f"budget of {self.scheduler.max_tokens} tokens (schedule section)"
            )
        if int(stream.tokens.max()) >= spec.vocab_size:
            raise DataError(f"{where}.data: token id {int(stream.tokens.max())} >= vocab_size")
        try:
            sampler = TaskSampler(stream, cfg.seq_len, cfg.seed)
        except DataError as exc:
            raise DataError(f"{where}.data: {exc}") from None
        shape = AdapterShape(cfg.rank, cfg.alpha, cfg.dropout, tuple(cfg.target_modules))
        adapter = LoraAdapter(cfg.name, shape, self.model.base, seed=cfg.seed, device=self.device)
        run = _TaskRun(cfg, adapter, sampler, self.dp)
        self.history[cfg.name] = []
        (self.runs if cfg.join_at <= self.fused_steps else self.waiting)[cfg.name] = run

    def remove_task(self, name: str) -> LoraAdapter:
        """Stop a task now (unsaved); its partial batch's gradients are dropped."""
        run = self.runs.pop(name, None) or self.waiting.pop(name, None)
        if run is None:
            raise ConfigError(f"tasks.{name}: no such task is training")
        run.optimizer.zero_grad(set_to_none=True)
        return run.adapter

    @property
    def done(self) -> bool:
        return not self.runs and not self.waiting

    def _join(self) -> None:
        if not self.runs and self.waiting:  # nothing to run until the next task joins
            self.fused_steps = max(
                self.fused_steps, min(r.cfg.join_at for r in self.waiting.values())
            )
        for name in [n for n, r in self.waiting.items() if r.cfg.join_at <= self.fused_steps]:
            self.runs[name] = self.waiting.pop(name)
            self.runs[name].last_time = time.perf_counter()

    def step(self) -> list[TaskStepRecord]:
        """One fused step (a forward + backward per fused group); the optimizer steps it
        completed. Each group's finished tasks start their gradient all-reduce as soon as
        its backward is done and wait for it only before their optimizer steps."""
        self._join()
        plan = self.scheduler.plan([r.demand() for r in self.runs.values()])
        if not plan.take:
            return []
        runs = [self.runs[name] for name, _ in plan.take]
        parts = [
            TaskRows(run.cfg.name, run.adapter, run.next_rows(n, self.device))
            for run, (_, n) in zip(runs, plan.take, strict=True)
        ]
        self.model.train()
        grads = [sum(p.numel() for p in run.adapter.parameters()) for run in runs]
        pending = []
        for group in self.dp.groups([p.sequences.num_tokens for p in parts], grads):
            done = self._forward_backward([runs[i] for i in group], [parts[i] for i in group])
            pending.append((done, self.dp.reduce_async(self._reduced(done))))
        self.fused_steps += 1
        records = []
        for done, reduce in pending:
            reduce.wait()
            records += [self._update(run) for run in done]
        return records

    def _forward_backward(self, runs: list[_TaskRun], parts: list[TaskRows]) -> list[_TaskRun]:
        """One forward + backward over ``parts``; the runs whose batch it completed."""
        losses = self.model(parts)
        total = sum(loss / run.normalizer for loss, run in zip(losses, runs, strict=True))
        total.backward()
        for loss, run in zip(losses, runs, strict=True):
            run.loss_sum = run.loss_sum + loss.detach()
        return [run for run in runs if run.batch_done]

    @staticmethod
    def _reduced(runs: list[_TaskRun]) -> list[torch.Tensor]:
        """What is summed over ranks before a task's step: its gradients and loss sum."""
        tensors = []
        for run in runs:
            run.loss_sum = torch.as_tensor(run.loss_sum, dtype=torch.float32).reshape(1)
            tensors += [p.grad for p in run.adapter.parameters() if p.grad is not None]
            tensors.append(run.loss_sum)
        return tensors

    def _update(self, run: _TaskRun) -> TaskStepRecord:
        cfg = run.cfg
        lr = cfg.lr * lr_factor(
            run.step,
            warmup_steps=cfg.warmup_steps,
            total_steps=cfg.steps,
            min_ratio=cfg.min_lr_ratio,
        )
        if self.before_update is not None:
            self.before_update(cfg.name, run.step + 1, run.adapter)
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(run.adapter.parameters(), cfg.max_grad_norm)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.step += 1
        now = time.perf_counter()
        record = TaskStepRecord(
            cfg.name, run.step, cfg.steps, float(run.loss_sum) / run.normalizer, lr,
            run.batch.num_tokens, now - run.last_time,
        )  # fmt: skip
        run.batch, run.last_time = None, now
        self.history[cfg.name].append(record)
        if self.on_step is not None:
            self.on_step(record)
        if run.step == cfg.steps:
            self._leave(run)
        return record

    def _leave(self, run: _TaskRun) -> None:
        name = run.cfg.name
        del self.runs[name]
        self.finished[name] = run.adapter
        path = None
        if self.output_dir is not None:
            path = save_adapter(run.adapter, self.output_dir / name, self.base_model)
        if self.on_finish is not None:
            self.on_finish(name, path)

    def run(self, max_fused_steps: int | None = None) -> dict[str, LoraAdapter]:
        """Step until every task has finished (or ``max_fused_steps``); the trained adapters."""
        while not self.done and (max_fused_steps is None or self.fused_steps < max_fused_steps):
            self.step()
        return self.finished
