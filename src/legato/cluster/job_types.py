"""legato's own job types: what ``legato cluster profile`` measures and ``cluster run`` runs.

A jobs TOML may define types as ``[type.NAME]`` tables: ``batch`` (the per-worker local
batch a job of this type runs at by default, and the one the profile measures at) and
``config``, a ``legato train`` config (the same tables as a train TOML). The cluster owns
the fields that make a job a cluster job (``CLUSTER_OWNED``: its steps, batch, split,
strategy, run directory, checkpointing); a type that sets one is refused. In the
co-location table a type is ``"NAME (batch size B)"``, Gavel's way of naming a job type, so
the same jobs file is simulated (``cluster simulate --profile``) and run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from legato.errors import ConfigError, DataError
from legato.parallel.batch_split import microbatch_count
from legato.specs.typed import from_dict

# dotted train-config fields the cluster sets for every job (see ``train_config``)
CLUSTER_OWNED = (
    "train.steps",
    "train.global_batch_size",
    "train.micro_batch_size",
    "train.batch_split",
    "parallel.strategy",
    "parallel.nproc",
    "parallel.cluster",
    "checkpoint.every",
    "checkpoint.resume",
    "run.dir",
)


@dataclass(frozen=True)
class JobType:
    name: str
    batch: int
    config: dict[str, Any]

    @property
    def key(self) -> str:
        """The type's name in a co-location table (Gavel's ``"<model> (batch size N)"``)."""
        return f"{self.name} (batch size {self.batch})"


def read_job_types(data: dict[str, Any], path: str | Path) -> dict[str, JobType]:
    """The ``[type.NAME]`` tables of a jobs file (``data``, already parsed), each checked as
    a train config now, so a bad one stops the run before anything starts."""
    tables = data.get("type", {})
    if not isinstance(tables, dict):
        raise DataError(f"{path}: 'type' must be tables [type.NAME], got {tables!r}")
    types = {}
    for name, table in tables.items():
        where = f"{path}: type.{name}"
        if not isinstance(table, dict) or set(table) - {"batch", "config"}:
            raise DataError(f"{where}: allowed keys are batch and config")
        batch = table.get("batch", 4)
        if not isinstance(batch, int) or batch < 1:
            raise DataError(f"{where}.batch: must be an integer >= 1, got {batch!r}")
        config = table.get("config", {})
        for dotted in CLUSTER_OWNED:
            section, key = dotted.split(".")
            if key in config.get(section, {}):
                raise DataError(f"{where}.config.{dotted}: set by the cluster for each job")
        kind = JobType(str(name), batch, config)
        train_config(kind, steps=1, workers=1, global_batch=batch, run_dir=".", where=where)
        types[kind.name] = kind
    return types


def train_config(
    kind: JobType,
    steps: int,
    workers: int,
    global_batch: int,
    run_dir: str | Path,
    split: tuple[int, ...] | None = None,
    where: str = "",
) -> Any:
    """The ``TrainConfig`` of one job of ``kind``: DDP over its workers, micro-batches of
    the even local batch (``runnable_split`` says which uneven splits that runs), saved
    only when stopped or done, resumed from its run directory."""
    from legato.train.config import TrainConfig

    data = copy.deepcopy(kind.config)
    owned = {
        "train": {
            "steps": steps,
            "global_batch_size": global_batch,
            "micro_batch_size": global_batch // workers,
            "batch_split": list(split) if split else [],
        },
        "parallel": {"strategy": f"dp={workers},zero=0", "nproc": workers, "cluster": "none"},
        "checkpoint": {"every": steps, "keep": 1, "resume": "auto"},
        "run": {"dir": str(run_dir)},
    }
    for section, values in owned.items():
        data.setdefault(section, {}).update(values)
    try:
        return from_dict(TrainConfig, data, "", ConfigError)
    except ConfigError as exc:
        raise DataError(f"{where or kind.name}.config: {exc}") from None


def runnable_split(split: tuple[int, ...], global_batch: int) -> tuple[int, ...]:
    """The nearest split the trainer runs at ``train_config``'s micro-batch size: every
    worker needs as many rows as the step runs micro-batches (``check_batch_split``), so
    rows move from the largest entry to the smallest until it holds."""
    mbs = global_batch // len(split)
    rows = list(split)
    while min(rows) < microbatch_count(rows, mbs):
        rows[rows.index(max(rows))] -= 1
        rows[rows.index(min(rows))] += 1
    return tuple(rows)
