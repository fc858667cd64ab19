"""TrainConfig: every knob of ``legato train``, from TOML plus ``--section.key[=]value``.

The config is a tree of dataclass sections; each field carries its documentation in its
metadata, so ``legato train --help-config`` and ``examples/tiny.toml`` are rendered from the
same source as the defaults and cannot drift. Loading goes through
``legato.specs.typed.from_dict``: an unknown key, a wrong type or a bad value is one
``ConfigError`` naming the dotted field and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from legato.atomic import make_dirs, naming
from legato.errors import ConfigError, SpecError
from legato.parallel.batch_split import FIELD as BATCH_SPLIT
from legato.parallel.batch_split import check_batch_split
from legato.parallel.job import AUTO, Job, owned_by_train, parse_strategy, resolve_job
from legato.specs.dtypes import FP8_TRAIN_DTYPES
from legato.specs.limits import MAX_BATCH, MAX_DEVICES, MAX_SIZE, MAX_STEPS, check_at_most
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict, read_table_file, to_dict, toml_literal
from legato.train.compile import check_compile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


DEFAULT_PRESET = "tiny"


def _doc(default: Any, doc: str) -> Any:
    """A dataclass field with an immutable default and its one-line documentation."""
    return field(default=default, metadata={"doc": doc})


def _require(ok: bool, name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{name}: must be {allowed}, got {value!r}")


def _at_most(section: Any, name: str, bound: int, low: int = 1) -> None:
    """The upper bound of an integer field, ``low`` its lower one (see legato.specs.limits)."""
    prefix = type(section).__name__.removesuffix("Section").lower()
    check_at_most(f"{prefix}.{name}", getattr(section, name), bound, ConfigError, low)


@dataclass
class ModelSection:
    """What is trained."""

    preset: str = _doc(
        DEFAULT_PRESET,
        "model preset name (see `legato models`), a TOML/JSON file or a Hugging Face model "
        "folder (config.json); left at the default with model.init set: model.init's model",
    )
    overrides: dict[str, Any] = field(
        default_factory=dict,
        metadata={"doc": "ModelSpec fields replacing the preset's, e.g. {num_layers = 2}"},
    )

    init: str = _doc(
        "",
        "weights to start from: a Hugging Face model folder or a legato run directory or "
        "checkpoint, of the same model; empty = a seeded random initialisation",
    )

    def __post_init__(self) -> None:
        _require(bool(self.preset), "model.preset", "a preset name or a file path", self.preset)


@dataclass
class DataSection:
    """Where the tokens come from."""

    paths: list[str] | str = field(
        default_factory=list,
        metadata={
            "doc": "text/jsonl/parquet files, folders or globs (a list, or one string); "
            "empty = the built-in corpus"
        },
    )
    text_field: str = _doc("text", "jsonl key / parquet column holding each document")
    tokenizer: str = _doc("byte", "'byte', 'bpe' (trained on data.paths) or a tokenizer.json path")
    bpe_vocab_size: int = _doc(4096, "vocabulary size when data.tokenizer = 'bpe'")
    seq_len: int = _doc(0, "tokens per training sequence; 0 = the model's seq_len")
    holdout: float = _doc(
        0.0, "fraction of the token stream (its tail) held out for validation; 0 = none"
    )
    cache_dir: str = _doc(
        "~/.cache/legato", "where tokenised data, trained tokenizers and the corpus are cached"
    )

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):  # `paths = "a.txt"` means the list of that one file
            self.paths = [self.paths] if self.paths else []
        _require(bool(self.text_field), "data.text_field", "a non-empty string", self.text_field)
        _require(bool(self.tokenizer), "data.tokenizer", "'byte', 'bpe' or a path", self.tokenizer)
        _require(self.bpe_vocab_size >= 257, "data.bpe_vocab_size", ">= 257", self.bpe_vocab_size)
        _require(self.seq_len >= 0, "data.seq_len", ">= 0 (0 = the model's)", self.seq_len)
        _require(0 <= self.holdout < 1, "data.holdout", "in [0, 1)", self.holdout)
        _require(bool(self.cache_dir), "data.cache_dir", "a directory path", self.cache_dir)
        _at_most(self, "bpe_vocab_size", MAX_SIZE, low=257)
        _at_most(self, "seq_len", MAX_SIZE, low=0)


@dataclass
class OptimSection:
    """AdamW and its learning-rate schedule (linear warm-up, then cosine to the minimum).

    Weight decay applies to weight matrices only: norms, biases and embedding tables are
    not decayed (decaying an embedding row shrinks rarely seen tokens toward zero between
    their updates, and decaying norm gains fights the scale they exist to learn).
    """

    lr: float = _doc(3e-3, "peak learning rate, reached at the end of warm-up")
    min_lr_ratio: float = _doc(0.1, "final learning rate as a fraction of optim.lr")
    weight_decay: float = _doc(
        0.1, "decoupled weight decay on matrices (not norms/biases/embeddings)"
    )
    beta1: float = _doc(0.9, "AdamW first-moment decay")
    beta2: float = _doc(0.95, "AdamW second-moment decay")
    eps: float = _doc(1e-8, "AdamW denominator epsilon")
    grad_clip: float = _doc(1.0, "clip the global gradient norm to this; 0 = no clipping")
    warmup_steps: int = _doc(20, "steps of linear warm-up from lr/warmup_steps to lr")

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", "> 0", self.lr)
        _require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "in [0, 1]", self.min_lr_ratio)
        _require(self.weight_decay >= 0, "optim.weight_decay", ">= 0", self.weight_decay)
        _require(0 <= self.beta1 < 1, "optim.beta1", "in [0, 1)", self.beta1)
        _require(0 <= self.beta2 < 1, "optim.beta2", "in [0, 1)", self.beta2)
        _require(self.eps > 0, "optim.eps", "> 0", self.eps)
        _require(self.grad_clip >= 0, "optim.grad_clip", ">= 0 (0 = off)", self.grad_clip)
        _require(self.warmup_steps >= 0, "optim.warmup_steps", ">= 0", self.warmup_steps)
        _at_most(self, "warmup_steps", MAX_STEPS, low=0)


@dataclass
class TrainSection:
    """The loop: how long, how big a batch, in what precision."""

    steps: int = _doc(300, "optimizer steps to train for (the schedule ends here)")
    global_batch_size: int = _doc(12, "sequences per optimizer step, summed over all ranks")
    micro_batch_size: int = _doc(
        6, "sequences per forward/backward; micro-batches per step = global / (micro x dp)"
    )
    batch_split: list[int] = field(
        default_factory=list,
        metadata={
            "doc": "each data-parallel rank's local batch, e.g. [5, 3] (Gimbal's sample "
            "stealing): sums to global_batch_size, every entry >= the micro-batches per "
            "step (max of ceil(entry / micro)); pp = 1 only; the prediction prices the "
            "even split; [] = the even split"
        },
    )
    dtype: Literal["fp32", "bf16", "fp16", "fp8", "fp8-rowwise"] = _doc(
        "fp32",
        "'fp32'; 'bf16' mixed precision (fp32 master weights); 'fp16' the same with dynamic "
        "loss scaling (for GPUs without bf16; a step whose gradients overflow is skipped); "
        "'fp8' (tile-wise) or 'fp8-rowwise': bf16 with FP8 block linears and experts",
    )
    fp8_all_gather: bool = _doc(
        False,
        "with an FP8 dtype and FSDP2 (zero >= 2, pp = 1, tp = 1): all-gather FP8 weights as "
        "tile-scaled e4m3 (half of bf16); elsewhere the weights are gathered in bf16",
    )
    device: Literal["auto", "cpu", "cuda"] = _doc("auto", "'auto' = cuda when available, else cpu")
    seed: int = _doc(0, "seed of the model init and of the data order")
    moe_aux_loss_coef: float = _doc(
        0.01, "weight of the MoE load-balance loss added to the objective (not to the logged loss)"
    )
    router_bias_rate: float = _doc(
        0.0, "MoE aux-loss-free balancing: router bias step per optimizer step; 0 = off"
    )
    log_every: int = _doc(10, "print a progress line every N steps (metrics.jsonl gets every step)")
    eval_every: int = _doc(
        0, "validation loss on the data.holdout split every N steps and at the last; 0 = never"
    )
    profile_steps: int = _doc(
        0,
        "profile this many steps after the run's first (a warm-up) under torch.profiler: "
        "each rank's Kineto trace in <run>/profile/, and the measured time per term of "
        "`legato predict --explain` (compute by op class, each collective, host) beside "
        "the run's prediction in profile/terms.json; 0 = off (`legato train --profile` = 3)",
    )
    compile: bool = _doc(
        False,
        "compile each transformer block's forward with torch.compile (as torchtitan); "
        "refused, in one line, where a strategy cannot run compiled",
    )
    compile_backend: Literal["inductor", "aot_eager"] = _doc(
        "inductor",
        "torch.compile backend with train.compile: 'inductor' generates kernels (needs a "
        "C++ compiler on CPU); 'aot_eager' traces the same graphs and runs them eagerly",
    )

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "train.steps", ">= 1", self.steps)
        _require(
            self.global_batch_size >= 1, "train.global_batch_size", ">= 1", self.global_batch_size
        )
        _require(
            self.micro_batch_size >= 1, "train.micro_batch_size", ">= 1", self.micro_batch_size
        )
        _require(self.seed >= 0, "train.seed", ">= 0", self.seed)
        _require(
            self.moe_aux_loss_coef >= 0, "train.moe_aux_loss_coef", ">= 0", self.moe_aux_loss_coef
        )
        _require(
            self.router_bias_rate >= 0, "train.router_bias_rate", ">= 0", self.router_bias_rate
        )
        _require(self.log_every >= 1, "train.log_every", ">= 1", self.log_every)
        _require(self.eval_every >= 0, "train.eval_every", ">= 0 (0 = never)", self.eval_every)
        _require(
            self.profile_steps >= 0, "train.profile_steps", ">= 0 (0 = off)", self.profile_steps
        )
        _at_most(self, "steps", MAX_STEPS)
        _at_most(self, "log_every", MAX_STEPS)
        _at_most(self, "eval_every", MAX_STEPS, low=0)
        _at_most(self, "profile_steps", MAX_STEPS, low=0)
        _at_most(self, "global_batch_size", MAX_BATCH)
        _at_most(self, "micro_batch_size", MAX_BATCH)
        _require(
            not self.fp8_all_gather or self.dtype in FP8_TRAIN_DTYPES,
            "train.fp8_all_gather",
            "false unless train.dtype is 'fp8' or 'fp8-rowwise'",
            self.fp8_all_gather,
        )


@dataclass
class ParallelSection:
    """How the job is spread over processes."""

    nproc: int = _doc(2, "processes to launch on this host (ignored when started by torchrun)")
    nodes: int = _doc(
        1,
        "hosts the job spans, parallel.nproc processes on each; more than one is started "
        "by torchrun on every host (`legato train` prints the command)",
    )
    backend: Literal["auto", "gloo", "nccl"] = _doc("auto", "'auto' = nccl on cuda, gloo on cpu")
    strategy: str = _doc(
        "",
        "the layout, as `legato plan` prints it: dp, zero (0 DDP, 1 sharded optimizer, "
        "2/3 FSDP2), tp (tp=AxB for 2-D), sp, cp, pp, vpp, schedule, slices, memory_cap, "
        "first_stage_layers, last_stage_layers, embedding_stage, loss_stage, ep, etp, "
        "moe_overlap, moe_chunks, moe_groups, recompute, swap, loss_chunk; mbs, gbs and "
        "dtype set train.micro_batch_size, train.global_batch_size and train.dtype; '' = "
        "FSDP2 over all processes; 'auto' = the planner's pick for this job",
    )
    cluster: str = _doc(
        "",
        "the machine the cost model prices the run on (each step logs its prediction): a "
        "cluster preset or file (`legato calibrate`); '' = this host (CPU: calibrated once "
        "and cached; GPU: its node preset); 'none' = no prediction",
    )

    def __post_init__(self) -> None:
        _require(self.nproc >= 1, "parallel.nproc", ">= 1", self.nproc)
        _at_most(self, "nproc", MAX_DEVICES)
        _at_most(self, "nodes", MAX_DEVICES)
        if self.strategy != AUTO:
            parse_strategy(self.strategy)  # a ConfigError now rather than after the launch


@dataclass
class CheckpointSection:
    """When to save and where to resume from."""

    every: int = _doc(100, "save every N steps and at the last step; 0 = never save")
    keep: int = _doc(2, "keep the newest N checkpoints, delete older ones")
    resume: str = _doc(
        "auto",
        "'auto' = run.dir's latest intact checkpoint, if any; 'none' = step 0 (in an empty "
        "run.dir, see run.fresh); or a checkpoint, checkpoints/ or run directory path",
    )

    def __post_init__(self) -> None:
        _require(self.every >= 0, "checkpoint.every", ">= 0 (0 = never)", self.every)
        _require(self.keep >= 1, "checkpoint.keep", ">= 1", self.keep)
        _require(bool(self.resume), "checkpoint.resume", "'auto', 'none' or a path", self.resume)
        _at_most(self, "every", MAX_STEPS, low=0)
        _at_most(self, "keep", MAX_STEPS)


@dataclass
class RunSection:
    """Where the outputs go."""

    dir: str = _doc("", "run directory; empty = runs/<name>, or runs/<timestamp> without a name")
    name: str = _doc("", "a label for the run, recorded in its metadata")
    fresh: bool = _doc(
        False,
        "start over in a run directory that holds a run: delete its files (once its lock "
        "is held) and train from step 0; without it such a directory is resumed from its "
        "newest intact checkpoint, or refused when it has none",
    )


@dataclass
class TrainConfig:
    """The whole training job."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    run: RunSection = field(default_factory=RunSection)

    def __post_init__(self) -> None:
        # mbs, gbs and dtype of a pasted strategy are the train fields: one number each
        for name, value in owned_by_train(self.parallel.strategy).items():
            setattr(self.train, name, value)
        self.train.__post_init__()
        if self.train.batch_split:  # against the batch sizes a pasted strategy may have set
            check_batch_split(
                self.train.batch_split, self.train.global_batch_size, self.train.micro_batch_size
            )
        _require(
            not self.train.eval_every or self.data.holdout > 0,
            "train.eval_every",
            "0 unless data.holdout > 0 (the split it evaluates on)",
            self.train.eval_every,
        )

    def with_strategy(self, text: str) -> TrainConfig:
        """A copy running ``parallel.strategy = text`` (its mbs, gbs, dtype set the train
        fields, as when pasted)."""
        parallel = dataclasses.replace(self.parallel, strategy=text)
        return dataclasses.replace(self, parallel=parallel, train=copy.copy(self.train))

    def job(self, spec: ModelSpec, world: int) -> Job:
        """``parallel.strategy`` resolved for ``spec`` on ``world`` processes (one-line
        errors naming the key for anything the runtime cannot place)."""
        job = resolve_job(
            self.parallel.strategy,
            spec,
            world,
            mbs=self.train.micro_batch_size,
            gbs=self.train.global_batch_size,
            dtype=self.train.dtype,
            seq_len=self.data.seq_len or spec.seq_len,
        )
        split = self.train.batch_split
        if split and job.strategy.pp > 1:
            raise ConfigError(
                f"{BATCH_SPLIT}: must be [] with pp > 1 (a pipeline schedule runs equal "
                f"micro-batches on every replica), got {split!r}"
            )
        if split:
            check_batch_split(split, job.strategy.gbs, job.strategy.mbs, job.strategy.dp)
        if self.train.compile:
            check_compile(job.strategy)
        return job

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


# ``--section.key`` of every bool field: on the command line it may stand alone (``--run.fresh``)
TRAIN_FLAGS = frozenset(
    f"--{section.name}.{f.name}"
    for section in dataclasses.fields(TrainConfig)
    for f in dataclasses.fields(section.default_factory)
    if f.type == "bool"
)

# Fields that moved into parallel.strategy (one place for the layout), and where they went.
REPLACED = {
    "parallel.fsdp": "parallel.strategy's zero: zero=3 FSDP2 (the default), zero=0 DDP",
    "parallel.reshard_after_forward": "parallel.strategy's zero: zero=3 reshards after "
    "forward, zero=2 keeps parameters gathered",
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read ``path`` (TOML or JSON; None = defaults) and apply ``--section.key=value`` overrides."""
    updates = parse_overrides(overrides or [])  # first: a malformed override explains more
    data = read_table_file(path, ConfigError) if path is not None else {}
    merged = _deep_merge(data, updates)
    for name, instead in REPLACED.items():
        section, key = name.split(".")
        if key in merged.get(section, {}):
            raise ConfigError(f"{name}: no longer a config field; use {instead}")
    return from_dict(TrainConfig, merged, "", ConfigError)


def split_command_line(
    tokens: list[str], flags: frozenset[str] = frozenset()
) -> tuple[str | None, list[str]]:
    """``(config file or None, overrides as --section.key=value)`` of a command line.

    Users type both ``--train.steps=10`` and ``--train.steps 10``: a ``--key`` without
    ``=`` takes the next token as its value. Any other token is the config file, which
    may come before, between or after the overrides (argparse would take the value of a
    space-form override for the positional CONFIG, so the CLI leaves both to this).
    A key in ``flags`` (``TRAIN_FLAGS``) may also stand alone, meaning true.
    """
    positionals: list[str] = []
    overrides: list[str] = []
    tokens = list(tokens)
    while tokens:
        arg = tokens.pop(0)
        if not arg.startswith("--"):
            positionals.append(arg)
        elif "=" in arg:
            overrides.append(arg)
        elif "--" + arg[2:].replace("-", "_") in flags and tokens[:1] not in (["true"], ["false"]):
            overrides.append(f"{arg}=true")
        elif tokens and not tokens[0].startswith("--"):
            overrides.append(f"{arg}={tokens.pop(0)}")
        else:
            raise ConfigError(
                f"{arg}: overrides are written --section.key=value or --section.key value; "
                "this one has no value"
            )
    if len(positionals) > 1:
        raise ConfigError(
            f"{positionals[1]}: one config file at most (already given {positionals[0]}); "
            "overrides are written --section.key=value or --section.key value"
        )
    return (positionals[0] if positionals else None), overrides


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--train.steps=10", "--model.overrides.num_layers", "2"]`` -> nested dict.

    Both ``--section.key=value`` and ``--section.key value`` are accepted. Values are TOML
    literals (``10``, ``3e-4``, ``true``, ``["a.txt"]``, ``{x = 1}``); anything else is
    taken as a plain string, so ``--train.dtype=bf16`` needs no quotes. Dashes in keys are
    read as underscores.
    """
    config, overrides = split_command_line(args)
    if config is not None:
        raise ConfigError(
            f"{config}: overrides are written --section.key=value or --section.key value"
        )
    tree: dict[str, Any] = {}
    for arg in overrides:
        key, raw = arg[2:].split("=", 1)
        parts = key.replace("-", "_").split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"{arg}: overrides are written --section.key=value")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{arg}: {part} was already given a plain value")
        node[parts[-1]] = parse_value(raw)
    return tree


def parse_value(raw: str) -> Any:
    """A TOML literal, or the raw string when it is not one."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    return value if isinstance(value, (str, int, float, bool, list, dict)) else raw


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_model(section: ModelSection) -> ModelSpec:
    """The preset (or, with the default preset, ``model.init``'s model) with
    ``model.overrides`` applied, validated as a ModelSpec, and checked to be the model
    ``model.init`` holds."""
    from legato.specs.registry import load_model
    from legato.train.model_init import check_init_spec, init_spec

    init = init_spec(section.init) if section.init else None
    from_init = init is not None and section.preset == DEFAULT_PRESET
    spec = init if from_init else load_model(section.preset)
    if section.overrides:
        merged = _deep_merge(to_dict(spec), section.overrides)
        try:
            spec = from_dict(ModelSpec, merged, "model.overrides", ConfigError)
        except SpecError as exc:
            raise ConfigError(f"model.overrides: {exc}") from None
    if init is not None:
        check_init_spec(spec, init, section.init)
    return spec


def make_run_dir(run: RunSection, root: Path = Path("runs")) -> Path:
    """Create and return the run directory: ``run.dir``, else ``runs/<name>``, else a new
    ``runs/<timestamp>`` (suffixed ``-1``, ``-2``... so two runs never share one)."""
    if run.dir or run.name:
        path = Path(run.dir).expanduser() if run.dir else root / run.name
        with naming("run.dir" if run.dir else "run.name"):
            return make_dirs(path)
    with naming("run.dir"):  # unset: a new folder under ``root``
        make_dirs(root)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        path = root / (stamp if attempt == 0 else f"{stamp}-{attempt}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"run.dir: could not create a fresh directory under {root}")


def render_toml(config: TrainConfig | None = None, header: str = "") -> str:
    """The config as TOML with every field's documentation as a comment above it."""
    config = config or TrainConfig()
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if lines:
            lines.append("")
        lines.append(f"# {type(value).__doc__.splitlines()[0]}")
        lines.append(f"[{section.name}]")
        for f in dataclasses.fields(value):
            lines.append(f"# {f.metadata['doc']}")
            lines.append(f"{f.name} = {toml_literal(getattr(value, f.name))}")
    return "\n".join(lines) + "\n"
