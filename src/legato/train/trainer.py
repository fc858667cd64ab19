"""The training loop: a seeded model laid out by its Job, AdamW, checkpoints, metrics.

``parallel.strategy`` is resolved once into a ``parallel.job.Job``; the run's one mesh is
built from it (``parallel.mesh``) and the model is laid out by ``parallel.parallelize``.
The loop sees one step interface: ``parallel.data_parallel_step.DataParallelStep`` without
a pipeline, ``parallel.pipeline_step.PipelineStep`` with one. Both keep the same loss
convention (the mean over every label token of the global batch, whatever the split), so
every layout reproduces one process step for step, and so does any ``train.batch_split``,
which ``Trainer.set_batch_split`` changes between steps while ``fit()`` runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import operator
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from legato.atomic import write_text_atomic
from legato.calibrate.device_peak import peak_flops
from legato.cost.flops import training_flops_per_token
from legato.cost.prediction import Prediction
from legato.data import PackedDataset, Tokenizer
from legato.errors import CheckpointError, ConfigError, DataError, LegatoError
from legato.models import build_model
from legato.moe import end_step
from legato.parallel.batch_split import FIELD as BATCH_SPLIT
from legato.parallel.batch_split import check_batch_split, even_split, microbatch_count
from legato.parallel.data_parallel_step import DataParallelStep
from legato.parallel.fp8 import compute_dtype
from legato.parallel.job import AUTO, Job
from legato.parallel.mesh import build_mesh, expert_dim, submesh
from legato.parallel.parallelize import parallelize
from legato.parallel.pipeline_step import PipelineStep
from legato.parallel.process_group import DistContext, process_group
from legato.specs.typed import to_dict
from legato.train import checkpoint as ckpt
from legato.train import resume
from legato.train.auto_strategy import resolve_auto
from legato.train.compile import compile_blocks
from legato.train.config import TrainConfig, resolve_model
from legato.train.evaluate import evaluate
from legato.train.interrupt import StopSignals, stopped_line
from legato.train.loss_scaler import LossScaler
from legato.train.metrics import (
    EvalMetrics,
    MetricsLog,
    StepMetrics,
    format_bytes,
    mfu,
    peak_memory_bytes,
    plot_loss_curve,
    read_metrics,
    summarize,
)
from legato.train.model_init import load_init
from legato.train.optim import apply_hyperparameters, build_lr_schedule, build_optimizer
from legato.train.prediction import NO_CLUSTER, Machine, compare, predict_job, resolve_machine
from legato.train.profile import StepProfiler, terms_table
from legato.train.progress import Progress
from legato.train.run_data import (
    check_vocab,
    eval_dataset,
    resolve_tokenizer,
    save_run_tokenizer,
    split_holdout,
    token_stream,
)
from legato.train.run_dir import claim_run_dir


@dataclass
class TrainResult:
    """What one ``fit()`` did: the losses of the steps it ran and where it wrote.

    ``interrupted``: a SIGINT/SIGTERM stopped it after ``steps[-1]`` (checkpointed unless
    ``checkpoint.every = 0``); the command then exits with ``interrupt.EXIT_INTERRUPTED``.
    """

    run_dir: Path
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    interrupted: bool = False


class Trainer:
    """``Trainer(config).fit()``: train, checkpoint and report; every rank returns the
    same losses."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.spec = resolve_model(config.model)
        self.seq_len = config.data.seq_len or self.spec.seq_len
        if self.seq_len > self.spec.seq_len:
            raise ConfigError(
                f"data.seq_len: must be <= the model's seq_len ({self.spec.seq_len}), "
                f"got {self.seq_len}"
            )
        self.batch_split: list[int] | None = None  # each dp rank's rows, once fit() has a Job
        self._pending_split: list[int] | None = None
        self._split_lock = threading.Lock()
        self._stop_requested = threading.Event()
        # set once fit() has resolved the layout (set_batch_split may be called from then
        # on) or has ended without one: what a cluster worker waits for before it says the
        # trainer started, so a split decided right after a launch never finds no layout
        self.layout_resolved = threading.Event()
        self.last_step = 0  # the newest finished step (read by a cluster executor's poll)
        # fp16's dynamic loss scale (None for the other dtypes)
        fp16 = compute_dtype(config.train.dtype) == torch.float16
        self.loss_scaler = LossScaler() if fp16 else None

    def request_stop(self) -> None:
        """Stop after the step under way, as a stop signal would: every rank stops after
        the same step and it is checkpointed (``checkpoint.every`` > 0). Callable from
        another thread (a cluster executor preempting or moving the job); a call on any
        rank stops all of them."""
        self._stop_requested.set()

    def set_batch_split(self, split: Sequence[int]) -> None:
        """Train on ``split`` (each dp rank's local batch, as ``train.batch_split``) from
        the next step on, without a restart (Gimbal's input-sample stealing).

        Callable from another thread while ``fit()`` runs (a Ray actor's). All ranks
        switch at the same step: at the end of each step rank 0's latest pending split
        rides the one all-reduce that already tells every rank whether to stop, so the
        caller may call every rank's trainer or rank 0's only (other ranks' calls are
        checked, then dropped). A split ``train.batch_split`` would refuse, pp > 1, or a
        call before ``fit()`` has resolved the layout is a ConfigError and changes
        nothing. The split is not checkpointed: a restart begins at ``train.batch_split``.
        """
        current = self.batch_split
        if current is None:
            raise ConfigError(
                f"{BATCH_SPLIT}: set_batch_split needs the layout fit() resolves; call it "
                "once training has started, or set train.batch_split"
            )
        if self.strategy.pp > 1:
            raise ConfigError(f"{BATCH_SPLIT}: cannot change with pp > 1, got {list(split)!r}")
        try:
            rows = [operator.index(n) for n in split]
        except TypeError:
            raise ConfigError(f"{BATCH_SPLIT}: must be a list of integers, got {split!r}") from None
        train = self.config.train
        check_batch_split(rows, train.global_batch_size, train.micro_batch_size, len(current))
        with self._split_lock:
            self._pending_split = rows

    def fit(self) -> TrainResult:
        """Train; a SIGINT/SIGTERM stops it cleanly (``interrupt``): during set-up by
        raising ``Interrupted``, in the loop after the step under way."""
        try:
            with (
                StopSignals() as self.signals,
                process_group(self.config.parallel.backend, self.config.train.device) as ctx,
                contextlib.ExitStack() as self._held,  # the run directory's lock, for the run
            ):
                return self._fit(ctx)
        finally:
            self.layout_resolved.set()  # no waiter waits on a fit that ended early

    # ------------------------------------------------------------------ set-up

    def _fit(self, ctx: DistContext) -> TrainResult:
        self.ctx = ctx
        if self.config.parallel.strategy == AUTO:  # under torchrun: every rank runs rank 0's pick
            chosen = resolve_auto(self.config, self.spec, ctx.world_size, ctx.device.type,
                                  say=print if ctx.is_main else lambda _: None)  # fmt: skip
            self.config = chosen.with_strategy(ctx.broadcast_object(chosen.parallel.strategy))
        cfg = self.config
        self.job = cfg.job(self.spec, ctx.world_size)
        self.job, why_not = self._predict(self.job, ctx)
        self.strategy = self.job.strategy
        self.batch_split = cfg.train.batch_split or even_split(self.strategy.gbs, self.strategy.dp)
        self.layout_resolved.set()
        ctx.mesh = build_mesh(self.job, ctx.device.type)
        with self.signals.held():  # the lock is never taken without its release
            run_dir, self._start = claim_run_dir(ctx, cfg, self._held)
        # --run.fresh is done: the config as run, checkpointed and resumed, does not repeat it
        cfg = self.config = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, fresh=False))
        self.dataset, self.eval_set, tokenizer = self._load_data()
        if ctx.is_main:  # the run keeps its tokenizer, whatever happens to the cache
            save_run_tokenizer(tokenizer, run_dir)
        tokenizer_name = tokenizer.name
        self._build(ctx)
        start, resumed_from, changes, resumed = self._resume()
        self.last_step = start
        if ctx.is_main:  # the config as run, with the directory it ran in
            ran = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
            resume.record_invocation(run_dir, ran, start, resumed_from, changes)
        self.progress = Progress(cfg.train.steps, start, cfg.train.log_every, ctx.is_main)
        self.progress.message(self._describe(run_dir, tokenizer_name))
        priced = why_not or _prediction_line(self.job.prediction, self.machine)
        if priced:
            self.progress.message(priced)
        if self._start is not None and self._start.note:
            self.progress.message(self._start.note)
        if resumed:
            self.progress.message(resumed)
        log = MetricsLog(run_dir / "metrics.jsonl", start) if ctx.is_main else None
        self.signals.defer()  # from here a signal stops the loop at the next step boundary
        try:
            result = self._loop(run_dir, start, log)
        finally:
            self.progress.close()
            if log is not None:
                log.close()
        if ctx.is_main:
            result.summary = self._finish(run_dir, result)
        return result

    def _predict(self, job: Job, ctx: DistContext) -> tuple[Job, str]:
        """``job`` with the cost model's prediction on ``parallel.cluster``, or unchanged
        with the one line that says why there is none."""
        cluster = self.config.parallel.cluster
        self.machine = None
        if cluster == NO_CLUSTER:
            return job, ""
        try:
            self.machine = resolve_machine(cluster, ctx.world_size, ctx.device.type)
            if self.machine is None:
                return job, (
                    f"no prediction: this host is not calibrated for {ctx.world_size} "
                    "process(es) (`legato train` does it once; or set parallel.cluster)"
                )
            priced = self.spec.with_(seq_len=self.seq_len)
            return dataclasses.replace(job, prediction=predict_job(priced, job, self.machine)), ""
        except LegatoError as exc:
            return job, f"no prediction on parallel.cluster = {cluster!r}: {exc}"

    def _load_data(self) -> tuple[PackedDataset, PackedDataset | None, Tokenizer]:
        """Training windows, the held-out evaluation set (None without data.holdout) and
        the tokenizer."""
        data, ctx = self.config.data, self.ctx
        with ctx.main_first():  # rank 0 fills the caches, the others then read them
            tokenizer = resolve_tokenizer(data)
            check_vocab(tokenizer, self.spec.vocab_size, data)
            tokens = token_stream(data, tokenizer)
        train_tokens, held_out = split_holdout(tokens, data.holdout)
        dataset = PackedDataset(train_tokens, self.seq_len, seed=self.config.train.seed)
        if held_out is None:
            return dataset, None, tokenizer
        return dataset, eval_dataset(held_out, self.seq_len, "data.holdout"), tokenizer

    def _build(self, ctx: DistContext) -> None:
        cfg, job = self.config, self.job
        low = compute_dtype(cfg.train.dtype)  # bf16 for bf16 and fp8; fp32 masters always
        no_bf16 = ctx.device.type == "cuda" and not torch.cuda.is_bf16_supported()
        if low == torch.bfloat16 and no_bf16:
            raise ConfigError("train.dtype: this GPU does not support bf16; use 'fp16' or 'fp32'")
        # The full model is built (seeded) on every rank and then laid out or cut into
        # stages, so any layout starts from identical weights.
        model = build_model(self.spec, seed=cfg.train.seed, device=ctx.device)
        self.num_params = sum(p.numel() for p in model.parameters())
        if job.strategy.pp > 1:
            self.step = PipelineStep(model, job, ctx, cfg.train.moe_aux_loss_coef)
            self.model = model  # the full model: its parameter names key the checkpoint
            self.swap = None
        else:
            laid_out = parallelize(model, job, ctx.mesh, fp8_all_gather=cfg.train.fp8_all_gather)
            self.step = DataParallelStep(
                laid_out, job, ctx.mesh, ctx.device, cfg.train.moe_aux_loss_coef
            )
            self.model = laid_out.module
            self.swap = laid_out.swap
        if cfg.train.compile:  # the laid-out blocks (recompute, TP, FP8 included)
            compile_blocks(self.step.module, cfg.train.compile_backend)
        if cfg.model.init and self._start is None:  # laid out first: each rank reads its slices
            load_init(cfg.model.init, self.model, self._owned)
        self.optimizer = build_optimizer(self.step.module, cfg.optim)
        self.scheduler = build_lr_schedule(self.optimizer, cfg.optim, cfg.train.steps)
        self.flops_per_token = training_flops_per_token(self.spec, seq_len=self.seq_len)
        self.peak = peak_flops(ctx.device, cfg.train.dtype) if ctx.is_main else None

    @property
    def _owned(self) -> list[str] | None:
        """The model FQNs this rank checkpoints (its stages'); None = the whole model."""
        return self.step.fqns

    def _resume(self) -> tuple[int, Path | None, dict[str, list[Any]], str]:
        """Load the checkpoint the run starts from (``claim_run_dir``), if any: (its step,
        its path, the config fields this invocation changes, the line that says so)."""
        cfg = self.config
        if self._start is None:
            return 0, None, {}, ""
        path, meta = self._start.path, self._start.meta
        ckpt.check_model_spec(meta, to_dict(self.spec), path)
        changes = resume.config_changes(meta["config"], cfg, self.spec.seq_len)
        resume.refuse_fixed(changes, path)
        try:
            self.dataset.load_state_dict(meta["data"])
        except DataError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        ckpt.load_checkpoint(self.ctx, path, self.model, self.optimizer, only=self._owned)
        apply_hyperparameters(self.optimizer, cfg.optim)  # the state carries the old ones
        self.scheduler.load_state_dict(resume.schedule_state(meta))
        if self.loss_scaler is not None and "loss_scaler" in meta:
            self.loss_scaler.load_state_dict(meta["loss_scaler"])
        self.scheduler.change(cfg.optim, cfg.train.steps)
        step = int(meta["step"])
        return step, path, changes, resume.resumed_line(path, step, changes, meta)

    def _describe(self, run_dir: Path, tokenizer_name: str) -> str:
        cfg, ctx, spec = self.config, self.ctx, self.spec
        how = "one process"
        if ctx.distributed:
            how = f"{ctx.world_size} processes, {self.job.describe()} over {ctx.backend}"
        micro, split = cfg.train.micro_batch_size, self.batch_split
        batch = f"dp {ctx.dp_size} x micro {micro} x {self.job.microbatches} micro-batches"
        if cfg.train.batch_split:
            batch = f"split {split} in {microbatch_count(split, micro)} micro-batches of <= {micro}"
        return (
            f"model {spec.name}: {self.num_params / 1e6:.2f}M params, {spec.num_layers} layers, "
            f"hidden {spec.hidden_size} | data: {len(self.dataset.tokens):,} tokens "
            f"({tokenizer_name}), {self.dataset.num_sequences:,} sequences of {self.seq_len} | "
            f"{how} on {ctx.device.type}, {torch.get_num_threads()} threads/process | batch "
            f"{cfg.train.global_batch_size} = {batch} | {cfg.train.dtype} | {cfg.train.steps} "
            f"steps | run dir {run_dir}"
        )

    # ------------------------------------------------------------------ the loop

    def _loop(self, run_dir: Path, start: int, log: MetricsLog | None) -> TrainResult:
        cfg, ctx = self.config, self.ctx
        profiler = None
        if cfg.train.profile_steps:
            profiler = StepProfiler(run_dir, ctx.rank, ctx.device, cfg.train.profile_steps)
        with profiler or contextlib.nullcontext():
            result = self._steps(run_dir, start, log, profiler)
        if profiler is not None and not profiler.reported:  # the run ended mid-profile
            if profiler.done:
                self._report_profile(profiler)
            else:
                self.progress.message(
                    "train.profile_steps: the run ended in its warm-up step, nothing was "
                    "profiled (the first step of a run is never measured)"
                )
        return result

    def _steps(self, run_dir: Path, start: int, log: MetricsLog | None,
               profiler: StepProfiler | None) -> TrainResult:  # fmt: skip
        cfg, ctx = self.config, self.ctx
        total, every = cfg.train.steps, cfg.checkpoint.every
        result = TrainResult(run_dir)
        predicted = self.job.prediction.step_time_s if self.job.prediction else None
        tokens = cfg.train.global_batch_size * self.seq_len
        saved = None
        for step in range(start + 1, total + 1):
            began = time.perf_counter()
            lr = self.scheduler.get_last_lr()[0]
            split = self.batch_split
            with profiler.step() if profiler else contextlib.nullcontext():
                inputs, labels = self.dataset.next_batch(
                    cfg.train.global_batch_size, ctx.dp_rank, ctx.dp_size, split
                )
                loss, grad_norm = self._train_step(inputs, labels, split)
            elapsed = time.perf_counter() - began
            profiled = profiler is not None and profiler.recording
            if profiler is not None:
                profiler.advance()
                if profiler.done and not profiler.reported:
                    self._report_profile(profiler)
            if not math.isfinite(loss):
                raise ConfigError(
                    f"optim.lr: training diverged at step {step} (loss {loss}); lower optim.lr "
                    "or raise optim.warmup_steps"
                )
            rate = tokens / elapsed
            metrics = StepMetrics(
                step=step,
                loss=loss,
                lr=lr,
                grad_norm=grad_norm,
                loss_scale=self.loss_scaler.scale if self.loss_scaler is not None else None,
                tokens=tokens,
                step_time_s=elapsed,
                tokens_per_s=rate,
                mfu=mfu(self.flops_per_token, rate, self.peak[0], ctx.world_size)
                if self.peak
                else None,
                peak_memory_bytes=peak_memory_bytes(ctx.device),
                predicted_step_time_s=predicted,
                batch_split=split,
                profiled=profiled,
            )
            result.steps.append(step)
            result.losses.append(loss)
            self.last_step = step
            if log is not None:
                log.write(metrics)
            self.progress.update(metrics)
            evals = cfg.train.eval_every
            if evals and (step % evals == 0 or step == total):
                self._evaluate(step, log)
            if every and (step % every == 0 or step == total):
                result.checkpoint, saved = self._save(run_dir, step), step
            if step < total and self._agree_next_step(step):
                result.interrupted = True
                if every and saved != step:  # save this step, even between checkpoints
                    result.checkpoint = self._save(run_dir, step)
                break
        return result

    def _report_profile(self, profiler: StepProfiler) -> None:
        """The profiled steps' terms beside the prediction: in profile/terms.json and as a
        table on the console (rank 0)."""
        profiler.reported = True
        doc = profiler.write_terms(self.job.prediction)
        if doc is None:
            return
        self.progress.message(
            f"profiled {doc['measured']['steps']} steps (traces and terms in "
            f"{profiler.folder}):\n" + "\n".join(terms_table(doc))
        )

    def _agree_next_step(self, step: int) -> bool:
        """What every rank does after ``step``, in one tiny all-reduce: the batch split
        (rank 0's pending one, if any; the others add zeros) and whether to stop (any rank
        got a stop signal), which is returned."""
        with self._split_lock:
            pending, self._pending_split = self._pending_split, None
        mine = pending if pending and self.ctx.is_main else [0] * len(self.batch_split)
        stop = int(self.signals.received is not None or self._stop_requested.is_set())
        flags = torch.tensor([stop, *mine], dtype=torch.int64, device=self.ctx.device)
        agreed = self.ctx.all_reduce_sum(flags).tolist()
        if any(agreed[1:]) and agreed[1:] != self.batch_split:
            self.progress.message(
                f"step {step + 1}: {BATCH_SPLIT} {self.batch_split} -> {agreed[1:]}"
            )
            self.batch_split = agreed[1:]
        return agreed[0] > 0

    def _evaluate(self, step: int, log: MetricsLog | None) -> None:
        """Validation loss on the held-out windows, summed over every rank's tokens."""
        ctx = self.ctx
        result = evaluate(
            self.step,
            self.eval_set,
            self.config.train.micro_batch_size,
            device=ctx.device,
            rank=ctx.dp_rank,
            world=ctx.dp_size,
            all_reduce=ctx.all_reduce_sum,
        )
        if log is not None:
            log.write(EvalMetrics(step, result.loss, result.perplexity, result.tokens))
        self.progress.message(
            f"step {step}: validation loss {result.loss:.4f}, perplexity {result.perplexity:.2f}"
        )

    def _train_step(
        self, inputs: torch.Tensor, labels: torch.Tensor, split: list[int]
    ) -> tuple[float, float | None]:
        """Forward/backward over the micro-batches (``split``: every dp rank's rows), then
        clip and update; (loss, grad norm). fp16: the gradients come out times the loss
        scale and are divided by it; a step that overflowed on any rank is skipped (grad
        norm None) and the learning-rate schedule moves on as after any step."""
        scaler = self.loss_scaler
        multiplier = scaler.scale if scaler is not None else 1.0
        loss = self.step.forward_backward(inputs, labels, split, multiplier)
        finite = True
        if scaler is not None:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            finite = scaler.unscale(params, self.ctx.device)
            scaler.update(finite)
        norm = None
        if finite:
            norm = self.step.clip_grad_norm(self.config.optim.grad_clip or math.inf)
            self.optimizer.step()
        with warnings.catch_warnings():  # a skipped step: torch warns the order is wrong
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.spec.is_moe:  # routers' load counts: bias update (if any) and reset
            # every rank whose layers routed other tokens (dp x cp, and tp when ep folds)
            dim = expert_dim(self.job.strategy)
            many = self.job.gradient_ranks > 1 or self.job.strategy.folded_ep
            group = submesh(self.ctx.mesh, dim).get_group() if many else None
            end_step(self.step.module, self.config.train.router_bias_rate, group)
        return loss, norm

    # ------------------------------------------------------------------ outputs

    def _save(self, run_dir: Path, step: int) -> Path:
        meta = {
            "strategy": self.strategy.to_string(),
            "model_spec": to_dict(self.spec),
            "config": self.config.to_dict(),
            "data": self.dataset.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.loss_scaler is not None:
            meta["loss_scaler"] = self.loss_scaler.state_dict()
        return ckpt.save_checkpoint(
            self.ctx,
            run_dir / "checkpoints",
            step,
            self.model,
            self.optimizer,
            meta,
            self.config.checkpoint.keep,
            only=self._owned,
        )

    def _finish(self, run_dir: Path, result: TrainResult) -> dict[str, Any]:
        """Loss curve, ``summary.json`` and a printed summary (rank 0); after a stop
        signal the same files and one line instead of the summary."""
        records = read_metrics(run_dir / "metrics.jsonl")
        summary = summarize(records)
        if summary:
            median, peak = summary["step_time_s_median"], summary["peak_memory_bytes"]
            summary.update(compare(self.job.prediction, median, peak))
        summary["interrupted"] = result.interrupted
        if records:
            curve = plot_loss_curve(records, run_dir / "loss_curve.png", f"{self.spec.name} loss")
            summary["loss_curve"] = str(curve)
        summary["metrics"] = str(run_dir / "metrics.jsonl")
        summary["peak_flops_source"] = self.peak[1] if self.peak else None
        latest = run_dir / "checkpoints" / ckpt.LATEST
        if latest.is_file():
            summary["checkpoint"] = str(latest.parent / latest.read_text().strip())
        write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
        if result.interrupted:
            line = stopped_line(result.steps[-1], self.config, run_dir, result.checkpoint)
            print(f"legato: {line}", file=sys.stderr, flush=True)
        else:
            self.progress.message(_summary_text(summary))
        return summary


def _summary_text(summary: dict[str, Any]) -> str:
    if "final_loss" not in summary:
        return "nothing to train: the checkpoint is already at train.steps"
    mfu_text = (
        f"{100 * summary['mfu_median']:.1f}% (peak {summary['peak_flops_source']})"
        if summary.get("mfu_median") is not None
        else "n/a"
    )
    lines = [
        f"done: loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} after "
        f"{summary['steps']} steps",
        f"  tokens/s (median) {summary['tokens_per_s_median']:,.0f}, MFU {mfu_text}, "
        f"peak memory {format_bytes(summary['peak_memory_bytes'])}",
        f"  metrics {summary['metrics']}",
        f"  loss curve {summary['loss_curve']}",
    ]
    if "predicted_step_time_s" in summary:
        memory = summary["predicted_over_measured_memory"]
        lines.insert(
            2,
            f"  step time: measured {summary['step_time_s_median']:.4f} s (median), predicted "
            f"{summary['predicted_step_time_s']:.4f} s (x{summary['predicted_over_measured_step']:.2f}); "
            f"peak memory predicted {format_bytes(summary['predicted_peak_memory_bytes'])}"
            + (f" (x{memory:.2f} of measured)" if memory else ""),
        )
    if "checkpoint" in summary:
        lines.append(f"  checkpoint {summary['checkpoint']}")
    return "\n".join(lines)


def _prediction_line(prediction: Prediction | None, machine: Machine | None) -> str:
    if prediction is None or machine is None:
        return ""
    return (
        f"predicted by the cost model on {machine.source}: {prediction.step_time_s:.4f} s "
        f"per step, peak memory {format_bytes(prediction.memory_gib * 2**30)}"
        + ("" if prediction.fits else f" (does not fit: {prediction.why_not_fits})")
    )
