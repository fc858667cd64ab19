"""Save and resume training with ``torch.distributed.checkpoint`` (DCP).

Layout of ``<run>/checkpoints/``::

    step_000120/            one complete checkpoint
        .metadata, *.distcp model + optimizer, sharded as trained (DCP; any world size loads it)
        rng_rank<r>.json    each rank's random generator states
        meta.json           the manifest, written last: step, world size, ModelSpec, config,
                            data and scheduler state, and the size and sha256 of every
                            other file
    latest                  the name of the newest complete checkpoint

A checkpoint is written into ``.tmp_step_000120/`` and renamed only once every rank has
finished and the manifest is complete, and ``latest`` is replaced atomically after that,
so a crash mid-save leaves the previous checkpoint in charge. Loading checks the manifest,
the sizes and the checksums before DCP reads anything (DCP itself loads flipped bytes
without complaint), so a damaged or foreign checkpoint is a one-line ``CheckpointError``
naming the file. A ``latest`` that is missing or names no checkpoint is not fatal: the
run resumes from the newest checkpoint that verifies, and says so (``latest_intact``).

Every entry is keyed by the full model's parameter names (FQNs), the optimizer state too
(``flatten_optimizer_state_dict``: one key per parameter and moment, no per-rank list of
groups). A pipeline rank saves only the stages it holds (``only``); DCP merges the ranks'
entries by name, and loading looks them up by name, so a checkpoint loads into any
layout: FSDP2 shards, DDP replicas, another pipeline split or a single process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

import legato
from legato.atomic import write_text_atomic
from legato.errors import CheckpointError
from legato.parallel.process_group import DistContext
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict, to_dict
from legato.train.rng import capture_rng, restore_rng

FORMAT_VERSION = 3  # 2: optimizer state flattened to one key per parameter; 3: sha256
READABLE_FORMATS = (2, 3)  # 2 (no checksums) still loads, with only its sizes checked
META = "meta.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    """DCP warns that it runs without a process group; for one process that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def save_checkpoint(
    ctx: DistContext,
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    keep: int,
    *,
    only: Collection[str] | None = None,
) -> Path:
    """Collective: write ``root/step_<step>`` atomically, point ``latest`` at it, prune.

    ``only``: the model FQNs this rank holds (a pipeline rank's stages); None = all.
    """
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ctx.barrier()
    with _quiet_dcp():
        dcp.save(_state(model, optimizer, only), checkpoint_id=tmp)
    write_text_atomic(tmp / f"rng_rank{ctx.rank}.json", json.dumps(capture_rng(ctx.device)))
    ctx.barrier()
    if ctx.is_main:
        written = [p for p in sorted(tmp.iterdir()) if p.is_file()]
        full_meta = {
            "format": FORMAT_VERSION,
            "legato_version": legato.__version__,
            "step": step,
            "world_size": ctx.world_size,
            **meta,
            "files": {p.name: p.stat().st_size for p in written},
            "sha256": {p.name: file_sha256(p) for p in written},
        }
        write_text_atomic(tmp / META, json.dumps(full_meta, indent=1))
        if final.exists():  # a re-run of this step: move the old one aside, never delete first
            os.replace(final, root / f".old_{final.name}")
        os.replace(tmp, final)
        write_text_atomic(root / LATEST, final.name + "\n")
        prune(root, keep, protect=final)
    ctx.barrier()
    return final


def prune(root: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never ``protect``, the one just
    written, even if a rerun left higher steps behind) and leftover temp dirs."""
    steps = [p for _, p in _steps(root) if p != protect]
    kept = keep - 1 if protect is not None else keep
    doomed = steps[: max(0, len(steps) - kept)]
    doomed += [p for p in root.glob(".tmp_step_*") if p.is_dir()]
    doomed += [p for p in root.glob(".old_step_*") if p.is_dir()]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _steps(root: Path) -> list[tuple[int, Path]]:
    """``[(step, step directory), ...]`` of ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and p.is_dir()
    )


def checkpoint_at(path: str | Path) -> Path:
    """The checkpoint a path names: a step directory, or the latest of a ``checkpoints/``
    folder or of a run directory (``checkpoint.resume`` = a path, ``legato eval``...)."""
    path = Path(path).expanduser()
    for root in (path, path / "checkpoints"):
        if (root / LATEST).is_file():
            return _follow_latest(root)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint.resume: no checkpoint at {path}")
    return path


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint to resume from, its verified ``meta.json`` and, when it is not the one
    ``latest`` names, the line that says why."""

    path: Path
    meta: dict[str, Any]
    note: str = ""


def latest_intact(root: Path) -> ResumePoint | None:
    """``checkpoint.resume = 'auto'`` in ``root`` (a run's ``checkpoints/``): the checkpoint
    ``latest`` names, verified (a damaged one is an error that names an earlier one); or,
    when that pointer is missing or names no checkpoint, the newest step directory whose
    files verify, noted; None when there is no such checkpoint."""
    if (root / LATEST).is_file():
        try:
            named = _follow_latest(root)
        except CheckpointError as exc:
            why = str(exc)
        else:
            return ResumePoint(named, read_meta(named))
    else:
        why = f"{root / LATEST} is missing"
    damaged = []
    for _, path in reversed(_steps(root)):
        try:
            meta = read_meta(path)
        except CheckpointError:
            damaged.append(path.name)
            continue
        skipped = f" (skipped damaged {', '.join(damaged)})" if damaged else ""
        note = f"{why}; resuming from the newest intact checkpoint, {path}{skipped}"
        return ResumePoint(path, meta, note)
    return None


def _follow_latest(root: Path) -> Path:
    name = (root / LATEST).read_text(encoding="utf-8", errors="replace").strip()
    path = root / name
    if not _STEP_DIR.match(name) or not path.is_dir():
        raise CheckpointError(f"{root / LATEST}: points to {name!r}, which is not a checkpoint")
    return path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in 1 MiB pieces (shards can be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_meta(path: Path) -> dict[str, Any]:
    """The checkpoint's ``meta.json``, after checking every file it lists is whole:
    present, of its recorded size and (format 3) of its recorded sha256.

    Not collective, and it reads every byte: a job's rank 0 calls it and shares the
    verdict (``run_dir.claim_run_dir``)."""
    meta_path = path / META
    if not meta_path.is_file():
        raise CheckpointError(
            f"{path}: no {META}; the checkpoint is incomplete or not a checkpoint"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{meta_path}: corrupt JSON ({exc})") from None
    needed = ("format", "step", "model_spec", "files", "data", "scheduler")
    if not isinstance(meta, dict) or any(k not in meta for k in needed):
        raise CheckpointError(f"{meta_path}: not a legato checkpoint (needs {', '.join(needed)})")
    if meta["format"] not in READABLE_FORMATS:
        raise CheckpointError(
            f"{meta_path}: format {meta['format']!r}, this legato reads "
            f"{', '.join(map(str, READABLE_FORMATS))}"
        )
    digests = meta.get("sha256")
    if meta["format"] >= 3 and (
        not isinstance(digests, dict) or set(digests) != set(meta["files"])
    ):
        raise CheckpointError(f"{meta_path}: the manifest has no sha256 for every file")
    for name, size in meta["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if file.stat().st_size != size:
            raise CheckpointError(
                f"{path}: {name} is {file.stat().st_size} bytes, expected {size} (truncated?)"
            )
    for name, digest in (digests or {}).items():
        if file_sha256(path / name) != digest:
            raise CheckpointError(
                f"checkpoint {path}: {name} is damaged (sha256 mismatch); delete this "
                f"checkpoint or resume from an earlier one ({_earlier_hint(path)})"
            )
    try:  # read here, or DCP logs a traceback for each way it tries before failing
        FileSystemReader(path).read_metadata()
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(f"{path}: DCP .metadata is unreadable ({_reason(exc)})") from None
    return meta


def is_verified(meta: dict[str, Any]) -> bool:
    """Whether the checkpoint's contents were checked (format 2 had only sizes)."""
    return "sha256" in meta


def _earlier_hint(path: Path) -> str:
    """``checkpoint.resume = '<the previous checkpoint>'``, or how to start over."""
    step = _STEP_DIR.match(path.name)
    earlier = [(n, p) for n, p in _steps(path.parent) if p != path]
    if step:
        earlier = [(n, p) for n, p in earlier if n < int(step.group(1))]
    if earlier:
        return f"checkpoint.resume = '{earlier[-1][1]}'"
    return "none here: --run.fresh starts the run over"


def first_difference(saved: Any, current: Any, where: str = "") -> str | None:
    """The first dotted field where two JSON-like values differ, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            if key == "description":
                continue
            found = first_difference(
                saved.get(key), current.get(key), f"{where}.{key}" if where else key
            )
            if found:
                return found
        return None
    if saved != current:
        return f"{where}: checkpoint has {saved!r}, config has {current!r}"
    return None


def check_model_spec(meta: dict[str, Any], spec: dict[str, Any], path: Path) -> None:
    """The run's spec must be the checkpoint's; fields added to ModelSpec since it was
    saved count as their defaults."""
    saved = to_dict(from_dict(ModelSpec, meta["model_spec"], "model_spec", CheckpointError))
    diff = first_difference(saved, spec)
    if diff:
        raise CheckpointError(f"{path}: model differs from the checkpoint's at {diff}")


def _options(only: Collection[str] | None) -> StateDictOptions:
    return StateDictOptions(strict=only is None, flatten_optimizer_state_dict=True)


def _state(
    model: nn.Module, optimizer: torch.optim.Optimizer, only: Collection[str] | None
) -> dict[str, Any]:
    """What DCP writes or fills: ``{"model": ..., "optim": ...}`` keyed by FQN."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(only))
    if only is not None:
        keep = set(only)
        model_sd = {name: value for name, value in model_sd.items() if name in keep}
    return {"model": model_sd, "optim": optim_sd}


def load_checkpoint(
    ctx: DistContext,
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    only: Collection[str] | None = None,
) -> None:
    """Collective: load model, optimizer and this rank's RNG states from ``path``.

    ``only`` as in ``save_checkpoint``: the FQNs to load, the rest of ``model`` untouched.
    """
    state = _state(model, optimizer, only)
    try:
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as exc:  # the latter is a BaseException
        raise CheckpointError(f"{path}: cannot be read ({_reason(exc)})") from None
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=_options(only),
    )
    rng_file = path / f"rng_rank{ctx.rank}.json"
    if rng_file.is_file():  # absent when resuming on more ranks than saved
        restore_rng(json.loads(rng_file.read_text(encoding="utf-8")), ctx.device)


def load_model_weights(
    path: Path, model: nn.Module, *, only: Collection[str] | None = None
) -> None:
    """The model's entries of checkpoint ``path`` into ``model``, plain (one process
    without a process group) or laid out (FSDP2, TP, ...: each rank reads its shards),
    whatever layout saved it; the optimizer state is not read. ``only`` as in
    ``load_checkpoint``."""
    state = {"model": _state_of_model(model, only)}
    try:
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(f"{path}: cannot be read ({_reason(exc)})") from None
    set_model_state_dict(model, state["model"], options=_options(only))


def _state_of_model(model: nn.Module, only: Collection[str] | None) -> dict[str, Any]:
    state = get_model_state_dict(model, options=_options(only))
    if only is None:
        return state
    keep = set(only)
    return {name: value for name, value in state.items() if name in keep}


def _reason(exc: BaseException) -> str:
    """One line about ``exc``; DCP wraps per-rank failures in a CheckpointException."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))  # (exception, traceback frames)
        exc = inner[0] if isinstance(inner, tuple) else inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
