"""FinetuneConfig: the base model, the run settings and any number of LoRA tasks, from TOML.

A config file has ``[base]`` (the frozen model), ``[run]`` (device, output folder, ...),
``[schedule]`` (token and memory budgets of a fused step), an optional
``[task_defaults]`` table merged under every task, and one ``[[tasks]]`` table per task.
Every mistake is one ``ConfigError`` naming the dotted field, and for a task its name:
``tasks.sql.rank: must be >= 1, got 0``. Data paths are relative to the config file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from legato.errors import ConfigError, LegatoError
from legato.specs.limits import MAX_BATCH, MAX_DEVICES, MAX_SIZE, MAX_STEPS, check_at_most
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict, read_table_file
from legato.train.config import ModelSection, parse_overrides, resolve_model

_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _require(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name}: must be {allowed}, got {value!r}")


@dataclass
class BaseSection:
    """The frozen base model: a preset (plus overrides) and optionally its weights, or a
    legato run whose checkpoint gives the model, its weights and its tokenizer."""

    preset: str = ""  # empty = "tiny" (or the run's model when weights is a legato run)
    overrides: dict[str, Any] = field(default_factory=dict)
    # a Hugging Face model folder (config.json + safetensors), HF-named .safetensors file or
    # folder, or a legato run directory or checkpoint; empty = random init (demos)
    weights: str = ""

    def spec(self) -> ModelSpec:
        try:
            return resolve_model(ModelSection(self.preset or "tiny", self.overrides))
        except LegatoError as exc:
            raise ConfigError(f"base: {exc}") from None


@dataclass
class TaskSection:
    """One LoRA task: its data, its adapter shape and its own optimizer and budget."""

    name: str
    data: str  # JSONL: {"prompt", "response"} (prompt not trained on) or {"text"}
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 0.0  # 0 = no clipping
    batch_size: int = 4  # sequences per optimizer step
    seq_len: int = 128  # tokens per sequence (examples are packed, never padded)
    steps: int = 100  # optimizer steps; the task leaves (and is saved) after the last one
    join_at: int = 0  # fused step at which the task joins the run
    seed: int = 0  # adapter init, data order and dropout masks

    def validate(self, where: str) -> None:
        """Raise a ConfigError naming ``where.<field>`` for the first out-of-range field."""
        checks = (
            ("name", bool(_TASK_NAME.match(self.name)), "letters, digits, _ . - (<= 64)"),
            ("data", bool(self.data), "a JSONL file path"),
            ("target_modules", bool(self.target_modules), "a non-empty list of layer names"),
            ("rank", self.rank >= 1, ">= 1"),
            ("alpha", self.alpha > 0, "> 0"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]"),
            ("max_grad_norm", self.max_grad_norm >= 0, ">= 0 (0 = off)"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("seq_len", self.seq_len >= 2, ">= 2"),
            ("steps", self.steps >= 1, ">= 1"),
            ("join_at", self.join_at >= 0, ">= 0"),
        )
        for name, ok, allowed in checks:
            _require(ok, f"{where}.{name}", allowed, getattr(self, name))
        bounds = (  # (field, low, high): see legato.specs.limits for the highs
            ("rank", 1, MAX_BATCH),
            ("batch_size", 1, MAX_BATCH),
            ("seq_len", 2, MAX_SIZE),
            ("steps", 1, MAX_STEPS),
            ("warmup_steps", 0, MAX_STEPS),
            ("join_at", 0, MAX_STEPS),
        )
        for name, low, high in bounds:
            check_at_most(f"{where}.{name}", getattr(self, name), high, ConfigError, low)

    def check_fits(self, spec: ModelSpec, where: str) -> None:
        """The task's sequences must fit the base model's positions."""
        _require(
            self.seq_len <= spec.seq_len,
            f"{where}.seq_len",
            f"<= the base model's seq_len {spec.seq_len}",
            self.seq_len,
        )


@dataclass
class ScheduleSection:
    """How big a fused step may be: the packing scheduler's budgets."""

    max_tokens_per_step: int = 0  # 0 = derived from the memory budget
    memory_budget_gb: float = 0.0  # for activations; 0 = 80% of free GPU memory / half free RAM
    profile: bool = True  # time the fused step at a few token counts and pack to the best

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_step", "memory_budget_gb"):
            _require(getattr(self, name) >= 0, f"schedule.{name}", ">= 0", getattr(self, name))
        check_at_most(
            "schedule.max_tokens_per_step", self.max_tokens_per_step, MAX_STEPS, ConfigError, 0
        )


@dataclass
class RunSection:
    """Where adapters go and how the run executes."""

    output_dir: str = "runs/finetune"  # one PEFT adapter folder per task
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["fp32", "bf16"] = "fp32"  # base weights and activations; adapters stay fp32
    tokenizer: str = ""  # 'byte' or a tokenizer.json path; empty = 'byte' or a legato base's
    seed: int = 0  # base weights when base.weights is empty
    log_every: int = 10  # plain progress line every N steps of a task
    nproc: int = 1  # data-parallel processes launched on this host (not under torchrun)

    def __post_init__(self) -> None:
        _require(bool(self.output_dir), "run.output_dir", "a directory path", self.output_dir)
        _require(self.log_every >= 1, "run.log_every", ">= 1", self.log_every)
        _require(self.nproc >= 1, "run.nproc", ">= 1", self.nproc)
        check_at_most("run.log_every", self.log_every, MAX_STEPS, ConfigError)
        check_at_most("run.nproc", self.nproc, MAX_DEVICES, ConfigError)


@dataclass
class FinetuneConfig:
    base: BaseSection = field(default_factory=BaseSection)
    run: RunSection = field(default_factory=RunSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    tasks: list[TaskSection] = field(default_factory=list)


def _task_where(index: int, table: Any) -> str:
    name = table.get("name") if isinstance(table, dict) else None
    return f"tasks.{name}" if isinstance(name, str) and name else f"tasks[{index}]"


def parse_task(table: dict[str, Any], where: str, base_dir: Path | None = None) -> TaskSection:
    """One task table (defaults already merged) as a validated TaskSection."""
    task = from_dict(TaskSection, table, where, ConfigError)
    task.validate(where)
    if base_dir is not None and not Path(task.data).expanduser().is_absolute():
        task.data = str(base_dir / task.data)
    return task


def finetune_config_from_dict(data: dict[str, Any], base_dir: Path | None = None) -> FinetuneConfig:
    """Build and validate a config from a parsed table; task data paths resolve from ``base_dir``."""
    data = dict(data)
    defaults = data.pop("task_defaults", {})
    raw_tasks = data.pop("tasks", [])
    if not isinstance(defaults, dict):
        raise ConfigError(f"task_defaults: expected a table, got {defaults!r}")
    config = from_dict(FinetuneConfig, data, "", ConfigError)  # an unknown section says so
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise ConfigError("tasks: give at least one [[tasks]] table")
    seen: set[str] = set()
    for i, table in enumerate(raw_tasks):
        where = _task_where(i, table)
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table, got {table!r}")
        task = parse_task({**defaults, **table}, where, base_dir)
        if task.name in seen:
            raise ConfigError(f"{where}.name: {task.name!r} is used by two tasks")
        seen.add(task.name)
        config.tasks.append(task)
    return config


def load_finetune_config(path: str | Path, overrides: list[str] | None = None) -> FinetuneConfig:
    """Read a TOML/JSON config and apply ``--section.key=value`` overrides (not ``tasks``)."""
    path = Path(path)
    data = read_table_file(path, ConfigError)
    for section, values in parse_overrides(overrides or []).items():
        if section == "tasks":
            raise ConfigError("tasks: cannot be overridden on the command line; use task_defaults")
        current = data.get(section, {})
        data[section] = {**current, **values} if isinstance(current, dict) else values
    return finetune_config_from_dict(data, path.resolve().parent)
