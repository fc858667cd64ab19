"""How fast each job type trains: alone on 1..N devices, packed in pairs, at any local batch.

Three measured sources meet here, each read in its published shape so a user can point at
the full files (``--colocation``, ``--profiles``) instead of the sample bundled in
``cluster/data/`` (see its README for where each comes from):

- Gavel's throughput table: steps/s of each job type alone at 1, 2, 4, 8 workers
  (data-parallel, the same per-worker batch) and of each pair of single-worker types packed
  on one device. The pair's rates over the solo rates are the packing slowdowns; a ``[0, 0]``
  entry means the pair does not fit on one device. ``legato cluster profile`` writes a table
  of legato's own jobs in the same shape, and a profile per type named after it.
- Pollux's profiles: step time as a function of the local batch on one device. A linear fit
  ``t(b) = a + c * b`` gives the *shape* of a job type's step time in its local batch (what
  sample stealing moves); Gavel's solo rate gives the scale at the type's reference batch.
- Gavel's W-worker rates count the steps of every worker (perfect scaling is W x the
  1-worker rate), so a W-worker job's step takes ``W/rate_W`` and its gradient
  synchronisation ``W/rate_W - 1/rate_1`` (the same per-worker batch; 0 where a measurement
  scaled super-linearly); 0 for a type measured on one worker only.

No torch here: the planner-side rule of DESIGN.md (policies are pure functions of state).
"""

from __future__ import annotations

import ast
import csv
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from legato.errors import DataError

DEFAULT_GPU = "v100"
# Gavel's model families -> the Pollux profile of the closest model: the same network where
# Pollux profiled it (ResNet-18/CIFAR-10, ResNet-50/ImageNet, NCF), else the nearest kind
# (an LSTM LM -> DeepSpeech2's RNN, Transformer -> BERT, the convolutional A3C/CycleGAN ->
# YOLOv3).
PROFILE_OF_FAMILY = {
    "ResNet-18": "cifar10",
    "ResNet-50": "imagenet",
    "Transformer": "bert",
    "LM": "deepspeech2",
    "Recommendation": "ncf",
    "A3C": "yolov3",
    "CycleGAN": "yolov3",
}
_BATCH = re.compile(r"\(batch size (\d+)\)")


def bundled(name: str) -> Path:
    """A file of the bundled sample (``cluster/data/``)."""
    return Path(str(resources.files("legato.cluster") / "data" / name))


@dataclass(frozen=True)
class BatchCurve:
    """Seconds per step on one device as a linear function of the local batch, in the
    profile's own units; ``reference`` is the batch that stands for a type's own batch."""

    intercept: float
    slope: float
    reference: float


@dataclass(frozen=True)
class Workloads:
    """The job types a cluster runs and their measured speeds (see the module docstring)."""

    solo: dict[tuple[str, int], float]  # (type, workers) -> steps/s alone
    pairs: dict[tuple[str, str], tuple[float, float]]  # (a, b) -> (rate of a, rate of b)
    curves: dict[str, BatchCurve]  # type -> its local-batch curve

    @property
    def types(self) -> tuple[str, ...]:
        """Single-worker types with packing data, in a stable order (trace jobs draw from it)."""
        return tuple(sorted(t for (t, w) in self.solo if w == 1 and t in self.curves))

    def check_type(self, job_type: str, field: str) -> None:
        if (job_type, 1) not in self.solo or job_type not in self.curves:
            raise DataError(
                f"{field}: unknown job type {job_type!r}; known: {', '.join(self.types)}"
            )

    def reference_batch(self, job_type: str) -> int:
        """The per-worker batch Gavel measured the type at (1 where the name has none)."""
        match = _BATCH.search(job_type)
        return int(match.group(1)) if match else 1

    def worker_line(self, job_type: str) -> tuple[float, float]:
        """(fixed seconds, seconds per sample) of one worker's step alone on a device: its
        step time is ``fixed + per_sample * local_batch``."""
        curve, reference = self.curves[job_type], self.reference_batch(job_type)
        at_reference = (curve.intercept + curve.slope * curve.reference) * self.solo[(job_type, 1)]
        per_sample = curve.slope * curve.reference / reference / at_reference
        return curve.intercept / at_reference, per_sample

    def worker_time(self, job_type: str, local_batch: float) -> float:
        """Seconds of one worker's compute per step at ``local_batch``, alone on a device."""
        fixed, per_sample = self.worker_line(job_type)
        return fixed + per_sample * local_batch

    def sync_time(self, job_type: str, workers: int) -> float:
        """Seconds of gradient synchronisation per step for ``workers`` data-parallel workers:
        the largest measured at up to that many workers (a ring all-reduce's time per byte
        hardly grows with the ring, and Gavel's few counts are too noisy to fit a slope to)."""
        measured = [
            self._sync_measured(job_type, w)
            for (t, w) in self.solo
            if t == job_type and 1 < w <= max(workers, 2)
        ]
        return max(measured) if workers > 1 and measured else 0.0

    def _sync_measured(self, job_type: str, workers: int) -> float:
        one = 1.0 / self.solo[(job_type, 1)]
        return max(0.0, workers / self.solo[(job_type, workers)] - one)

    def pair_speeds(self, a: str, b: str) -> tuple[float, float] | None:
        """(speed of a, speed of b) packed on one device, each over its solo speed; None when
        the pair was not measured or does not fit one device."""
        rates = self.pairs.get((a, b))
        if rates is None:
            flipped = self.pairs.get((b, a))
            rates = (flipped[1], flipped[0]) if flipped else None
        if rates is None or min(rates) <= 0:
            return None
        return rates[0] / self.solo[(a, 1)], rates[1] / self.solo[(b, 1)]


def load_workloads(
    colocation: str | Path | None = None,
    profiles: str | Path | None = None,
    gpu: str = DEFAULT_GPU,
) -> Workloads:
    """Gavel's table (``colocation``: a JSON file in its shape) for device ``gpu`` and the
    Pollux profiles (``profiles``: a folder of ``<model>.csv`` or ``<model>/placements.csv``);
    the bundled sample where a path is None."""
    table_path = Path(colocation) if colocation else bundled("gavel_v100.json")
    solo, pairs = _read_gavel(table_path, gpu)
    folder = Path(profiles) if profiles else bundled("pollux")
    by_model: dict[str, BatchCurve] = {}
    curves = {}
    for job_type, workers in solo:
        family = job_type.split(" (")[0]
        model = PROFILE_OF_FAMILY.get(family, family)  # legato's types are profiled by name
        if workers == 1 and (family in PROFILE_OF_FAMILY or _profile_path(folder, model)):
            if model not in by_model:
                by_model[model] = _read_pollux(folder, model)
            curves[job_type] = by_model[model]
    if not curves:
        raise DataError(
            f"{table_path}: no job type of a known family ({', '.join(PROFILE_OF_FAMILY)}) "
            f"or with a profile in {folder}"
        )
    return Workloads(solo=solo, pairs=pairs, curves=curves)


def _read_gavel(
    path: Path, gpu: str
) -> tuple[dict[tuple[str, int], float], dict[tuple[str, str], tuple[float, float]]]:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"--colocation: cannot read {path} as JSON ({exc})") from None
    if not isinstance(table, dict) or gpu not in table:
        known = ", ".join(table) if isinstance(table, dict) else "none"
        raise DataError(f"--gpu: {path} has no table for {gpu!r}; it has: {known}")
    solo: dict[tuple[str, int], float] = {}
    pairs: dict[tuple[str, str], tuple[float, float]] = {}
    for key, entry in table[gpu].items():
        job_type, workers = _job_key(key, path)
        if not isinstance(entry, dict) or not isinstance(entry.get("null"), int | float):
            raise DataError(f"{path}: entry {key} has no solo rate under 'null'")
        if entry["null"] > 0:
            solo[(job_type, workers)] = float(entry["null"])
        for other, rates in entry.items():
            if other == "null" or workers != 1:
                continue
            other_type, other_workers = _job_key(other, path)
            if other_workers == 1:
                pairs[(job_type, other_type)] = (float(rates[0]), float(rates[1]))
    return solo, pairs


def _job_key(key: str, path: Path) -> tuple[str, int]:
    try:
        job_type, workers = ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError):
        raise DataError(f"{path}: key {key!r} is not \"('<job type>', <workers>)\"") from None
    return str(job_type), int(workers)


def _profile_path(folder: Path, model: str) -> Path | None:
    for path in (folder / f"{model}.csv", folder / model / "placements.csv"):
        if path.is_file():
            return path
    return None


def _read_pollux(folder: Path, model: str) -> BatchCurve:
    path = _profile_path(folder, model) or folder / f"{model}.csv"
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = [r for r in csv.DictReader(handle) if r.get("placement", "1") == "1"]
        batch = np.array([float(r["local_bsz"]) for r in rows])
        seconds = np.array([float(r["step_time"]) - float(r["sync_time"]) for r in rows])
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(
            f"--profiles: cannot read {path} (columns placement, local_bsz, step_time, "
            f"sync_time): {exc}"
        ) from None
    if len(set(batch.tolist())) < 2:
        raise DataError(f"--profiles: {path} needs single-device rows at two local batches")
    slope, intercept = np.polyfit(batch, seconds, 1)
    return BatchCurve(
        intercept=max(float(intercept), 0.0),
        slope=max(float(slope), 1e-12),
        reference=float(np.median(batch)),
    )
