"""What a resume may change, and the record each invocation leaves in the run directory.

Every config field is in one of three classes:

* ``FIXED``: changing it would make the resumed run a different run (other tokens, batch,
  data order or numerics); a resume that changes one is refused, naming the field and
  both values.
* ``CHECKED_BY_CONTENT``: compared by what they produce, not by how they are written: the
  resolved ``ModelSpec`` must equal the checkpoint's (a preset moved to a file is fine)
  and the token stream's fingerprint must (a data file moved elsewhere is fine).
* ``CHANGEABLE``: applied from the resume step on and recorded. That includes the layout
  (``parallel.*``, ``train.micro_batch_size``, ``train.batch_split``, ``train.device``): DCP
  reshards a checkpoint into any layout, the global batch stays the same and the data
  position counts whole global batches.

The run directory keeps ``config.toml`` as its first invocation wrote it, and
``invocations.jsonl`` one line per invocation: when, the step it started from, the
checkpoint it resumed, the fields it changed (``[checkpoint's, new]``) and its full config.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from legato.atomic import write_text_atomic
from legato.errors import CheckpointError
from legato.train.checkpoint import is_verified
from legato.train.config import OptimSection, TrainConfig, render_toml
from legato.train.optim import ScheduleSegment

INVOCATIONS = "invocations.jsonl"

FIXED = {
    "data.text_field": "it selects other text",
    "data.tokenizer": "the model was trained on its token ids",
    "data.bpe_vocab_size": "the model was trained on its token ids",
    "data.seq_len": "the data position counts sequences of this length",
    "train.global_batch_size": "the data position and the loss scale count this batch",
    "train.seed": "it fixes the data order",
    "train.dtype": "the weights and moments were trained in this precision",
    "data.holdout": "it moves the boundary between training and held-out tokens",
}
CHECKED_BY_CONTENT = frozenset({"model.preset", "model.overrides", "data.paths"})
CHANGEABLE = frozenset(
    {
        "data.cache_dir",
        "model.init",  # read by a run's first start only: resuming loads the checkpoint
        *(f"optim.{f.name}" for f in dataclasses.fields(OptimSection)),
        "train.steps",
        "train.micro_batch_size",
        "train.batch_split",
        "train.fp8_all_gather",
        "train.device",
        "train.moe_aux_loss_coef",
        "train.router_bias_rate",
        "train.log_every",
        "train.eval_every",
        "train.profile_steps",
        "train.compile",
        "train.compile_backend",
        "parallel.nproc",
        "parallel.nodes",
        "parallel.backend",
        "parallel.strategy",
        "parallel.cluster",
        "checkpoint.every",
        "checkpoint.keep",
        "checkpoint.resume",
        "run.dir",
        "run.name",
        "run.fresh",
    }
)


def config_fields(config: dict[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 0.003, ...}``: every section field of a config as a dict."""
    return {
        f"{section}.{name}": value
        for section, fields in config.items()
        if isinstance(fields, dict)
        for name, value in fields.items()
    }


def config_changes(
    saved: dict[str, Any], config: TrainConfig, model_seq_len: int
) -> dict[str, list[Any]]:
    """The fields whose value differs from the checkpoint's config: ``{field: [old, new]}``.

    A field the checkpoint does not know (added to legato since) is not a change.
    ``data.seq_len`` is compared as used (0 means the model's, which both share).
    """
    old, new = config_fields(saved), config_fields(config.to_dict())
    for fields in (old, new):
        if fields.get("data.seq_len") == 0:
            fields["data.seq_len"] = model_seq_len
    return {
        key: [old[key], value] for key, value in new.items() if key in old and old[key] != value
    }


def refuse_fixed(changes: dict[str, list[Any]], path: Path) -> None:
    """A CheckpointError naming the first ``FIXED`` field that changed, with both values."""
    for key, why in FIXED.items():
        if key in changes:
            old, new = changes[key]
            raise CheckpointError(
                f"checkpoint {path}: {key} cannot change on resume ({why}): the checkpoint "
                f"has {old!r}, this run {new!r}; start a new run (another run.dir, or "
                "--run.fresh to start this one over) to change it"
            )


def resumed_line(path: Path, step: int, changes: dict[str, list[Any]], meta: dict[str, Any]) -> str:
    """``resumed from <path> (step N); changed: optim.lr 0.003 -> 0.01, ...``."""
    line = f"resumed from {path} (step {step})"
    if changes:
        line += "; changed: " + ", ".join(
            f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items()
        )
    if not is_verified(meta):
        line += "; note: this checkpoint predates checksums, only its file sizes were checked"
    return line


def schedule_state(meta: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``WarmupCosine`` state; a format-2 checkpoint (torch's LambdaLR
    state) gets the one segment its config describes."""
    state = meta["scheduler"]
    if "segments" in state:
        return state
    config = meta["config"]
    first = ScheduleSegment.first(OptimSection(**config["optim"]), config["train"]["steps"])
    return {"last_epoch": state["last_epoch"], "segments": [dataclasses.asdict(first)]}


def record_invocation(
    run_dir: Path,
    config: TrainConfig,
    start_step: int,
    resumed_from: Path | None,
    changes: dict[str, list[Any]],
) -> None:
    """Rank 0: add this invocation to ``invocations.jsonl``. A run starting at step 0
    (re)starts the record: ``config.toml`` and the log then describe this run only."""
    log, first = run_dir / INVOCATIONS, run_dir / "config.toml"
    fresh = start_step == 0
    lines = [] if fresh or not log.is_file() else log.read_text("utf-8").splitlines()
    if fresh or not first.is_file():
        write_text_atomic(first, render_toml(config, "legato train config"))
    entry = {
        "invocation": len(lines) + 1,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "start_step": start_step,
        "resumed_from": str(resumed_from) if resumed_from is not None else None,
        "changed": changes,
        "config": config.to_dict(),
    }
    write_text_atomic(log, "".join(line + "\n" for line in [*lines, json.dumps(entry)]))


def read_invocations(run_dir: Path) -> list[dict[str, Any]]:
    log = run_dir / INVOCATIONS
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text("utf-8").splitlines() if line.strip()]
