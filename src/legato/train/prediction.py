"""The machine a run is priced on, and the cost model's prediction for the job it trains.

Every run logs ``predicted_step_time_s`` beside ``step_time_s``: the thesis of legato is
one model of the job that is planned, run and checked, and the check is this pair.

Which machine (``parallel.cluster``):

* a preset name or a cluster file (``legato calibrate`` writes one; its side file of
  measured constants is used when present);
* ``""`` on the CPU: this host as ``legato calibrate --quick`` measures it for the run's
  process count, measured once per host and process count and cached under
  ``$LEGATO_CACHE_DIR`` (default ``~/.cache/legato``) ``/calibration/``. The measured
  rates are achieved rates (no efficiency on top), gloo computes and communicates with the
  same cores (no overlap), and PyTorch's CPU kernels are eager (``fused_elementwise``
  off): the settings ``benchmarks/local_truth.py`` checks. Where the processes outnumber
  the cores, a pipeline bubble lends the idle ranks' cores to the busy ones
  (``shared_host_bubble_speedup``). The fixed memory of a
  process is its resident set when the prediction is made (``_resident_gib``);
* ``"none"``: no prediction;
* ``""`` on a GPU: the node preset of that GPU (``hgx-h200`` for an H200, ...) with the
  run's process count on one node; no prediction for a GPU without one.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from legato.cost.calibration import CALIBRATION, Calibration, calibration_beside
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime
from legato.cost.training_step import predict
from legato.parallel.job import Job
from legato.parallel.process_group import host_cores, threads_per_process
from legato.specs import load_cluster
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec

CACHE_ENV = "LEGATO_CACHE_DIR"
NO_CLUSTER = "none"  # parallel.cluster: do not predict
# of the cached calibration, part of its key: a new one is measured when what it holds
# changes (4: the host's constants are a device profile, ``"profile"``)
FORMAT = 4
# a substring of torch.cuda.get_device_name -> the node preset of that GPU
GPU_NODES = {"H200": "hgx-h200", "H100": "dgx-h100", "H800": "h800", "A100": "dgx-a100",
             "4090": "rtx4090-pcie"}  # fmt: skip


@dataclass(frozen=True)
class Machine:
    """A cluster and how the cost model prices it (``source``: where it came from)."""

    cluster: ClusterSpec
    calibration: Calibration
    overlap: bool
    runtime: Runtime
    source: str


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "legato")


def host_cluster_file(nproc: int) -> Path:
    """Where this host's calibration for ``nproc`` processes is cached: keyed by host
    name, CPU, core count and torch version, since any of them changes the rates, and by
    the cache's ``FORMAT``."""
    import torch

    key = "|".join([platform.node(), platform.processor(), str(os.cpu_count()), torch.__version__,
                    str(FORMAT)])  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / "calibration" / f"host-{digest}-n{nproc}.toml"


def ensure_host_calibration(nproc: int, say=print) -> Path:
    """This host's cached cluster file for ``nproc`` processes, measuring it first (a few
    seconds, ``legato calibrate --quick``) when there is none. Call it before launching
    the training processes: the measurement starts processes of its own."""
    path = host_cluster_file(nproc)
    if not path.is_file():
        from legato.calibrate.cluster_file import write_cluster_file
        from legato.calibrate.host import calibrate

        say(f"calibrating this host for {nproc} process(es), once (cached in {path.parent})")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_cluster_file(calibrate(nproc, quick=True, verbose=False), path)
    return path


def resolve_machine(cluster: str, nproc: int, device_type: str) -> Machine | None:
    """The machine ``parallel.cluster`` names for a run of ``nproc`` processes on
    ``device_type``; None when there is nothing to price it with (a CPU host not yet
    calibrated, a GPU without a preset)."""
    if cluster:
        calibration = calibration_beside(cluster)
        measured = calibration is not None
        host = measured and device_type == "cpu"  # this host, as legato calibrate measured it
        if host:
            calibration = replace(calibration, framework_gib=_resident_gib())
        return Machine(
            load_cluster(cluster),
            calibration or CALIBRATION,
            overlap=not measured,
            runtime=Runtime(
                fused_elementwise=not measured,
                bubble_speedup=shared_host_bubble_speedup(nproc) if host else 1.0,
            ),
            source=cluster,
        )
    if device_type == "cuda":
        import torch

        name = torch.cuda.get_device_name()
        preset = next((p for key, p in GPU_NODES.items() if key in name), None)
        if preset is None:
            return None
        return Machine(
            load_cluster(preset, nodes=1, devices_per_node=nproc),
            CALIBRATION,
            overlap=True,
            runtime=Runtime(),
            source=f"{preset} ({name})",
        )
    path = host_cluster_file(nproc)
    if not path.is_file():
        return None
    return resolve_machine(str(path), nproc, device_type)


def shared_host_bubble_speedup(nproc: int) -> float:
    """``Runtime.bubble_speedup`` of ``nproc`` training processes on this host. Their
    calibration measured every process busy at once; in a pipeline bubble about half the
    ranks are busy (the fill and drain of 1F1B), and while processes outnumber cores each
    busy one then takes up to its own thread count in cores: ``threads * nproc / cores``,
    at most 2 (half the ranks busy), at least 1 (no shared cores, nothing to take)."""
    shared = threads_per_process(nproc) * nproc / host_cores()
    return max(1.0, min(shared, 2.0))


def _resident_gib() -> float:
    """This process's resident memory so far (torch, the process group, the data): on the
    CPU the fixed footprint of a training process, where the cost model's default
    ``framework_gib`` is a GPU's CUDA context and communication buffers."""
    import torch

    from legato.train.metrics import peak_memory_bytes

    return peak_memory_bytes(torch.device("cpu")) / 2**30


def predict_job(spec: ModelSpec, job: Job, machine: Machine) -> Prediction:
    """The cost model's step of ``job`` (its strategy priced as trained) on ``machine``."""
    return predict(
        spec,
        machine.cluster,
        job.strategy,
        overlap=machine.overlap,
        runtime=machine.runtime,
        calibration=machine.calibration,
    )


def compare(prediction: Prediction | None, step_s: float, peak_bytes: int) -> dict[str, Any]:
    """``summary.json``'s predicted-against-measured fields (empty without a prediction)."""
    if prediction is None:
        return {}
    memory = prediction.memory_gib * 2**30
    return {
        "predicted_step_time_s": prediction.step_time_s,
        "predicted_over_measured_step": prediction.step_time_s / step_s,
        "predicted_peak_memory_bytes": int(memory),
        "predicted_over_measured_memory": memory / peak_bytes if peak_bytes else None,
    }
