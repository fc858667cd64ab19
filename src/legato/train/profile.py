"""``train.profile_steps``: a few steps under ``torch.profiler``, measured in the cost
model's own terms.

The first step of the run warms up (allocator, autotuning, gloo connections) and is
traced but discarded; the next ``profile_steps`` are recorded. Each rank writes its
Kineto trace (``profile/trace_rank<r>.json``, chrome://tracing or Perfetto) and rank 0
``profile/terms.json`` with the measured time per step of each term ``legato predict
--explain`` prints beside the run's own prediction, so a prediction is checked term by
term and not only as one step time:

* compute by op class: ``gemm`` (matmul kernels), ``attention`` (fused attention), and
  ``memory-bound`` (every other op), from each op's *self* time so nested ops count once;
* each collective kind (all_reduce, all_gather, reduce_scatter, all_to_all, p2p,
  broadcast): on the CPU the time the step's thread spends in the call or its wait, which
  is what the step pays (exposed); on a GPU the communication kernels' time, and the part
  of it no compute kernel overlaps (exposed);
* ``host``: the rest of the step (Python, dispatch, waiting for other ranks);
* the memory peak (the allocator's on a GPU, the process's resident set on the CPU).

The op classes are the cost model's (``cost.layer``: gemm, attention, memory-bound); the
collectives are named as NCCL and gloo name them, the prediction's by mesh axis.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from legato.atomic import make_dirs, write_text_atomic
from legato.train.metrics import peak_memory_bytes

STEP_MARK = "legato.train_step"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
            "aten::_grouped_mm", "aten::addmv", "aten::mv", "aten::dot")  # fmt: skip
COLLECTIVES = (  # substring of an op or kernel name -> collective kind
    ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"),
    ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"), ("send", "p2p"), ("recv", "p2p"),
)  # fmt: skip


def op_class(name: str) -> str:
    """The cost model's class of one op or kernel: gemm, attention, a collective kind
    (``comm:<kind>``), or memory-bound."""
    lower = name.lower()
    if "c10d" in lower or "nccl" in lower or "gloo" in lower or lower == "record_param_comms":
        if "wait" in lower:  # an async collective's wait (FSDP2's, functional ones)
            return "comm:wait"
        return f"comm:{next((k for key, k in COLLECTIVES if key in lower), 'other')}"
    if "scaled_dot_product" in lower or "flash" in lower or "fmha" in lower or "attention" in lower:
        return "attention"
    if name in GEMM_OPS or "gemm" in lower or "cutlass" in lower or "xmma" in lower:
        return "gemm"
    return "memory-bound"


@dataclass
class Measured:
    """Seconds per profiled step by term, and the memory peak."""

    steps: int
    step_time_s: float
    compute_by_class_s: dict[str, float] = field(default_factory=dict)
    comm_s: dict[str, float] = field(default_factory=dict)  # by collective kind
    exposed_comm_s: dict[str, float] = field(default_factory=dict)
    host_s: float = 0.0
    peak_memory_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(events: list, peak_memory: int) -> Measured:
    """The terms of the profiled steps from the profiler's events, per step: the CPU ops
    of the step's thread inside a step mark by self time, GPU kernels (when any) by device
    time."""
    marks = [e for e in events if e.name == STEP_MARK]
    if not marks:
        return Measured(0, 0.0, peak_memory_bytes=peak_memory)
    thread = marks[0].thread
    spans = [(m.time_range.start, m.time_range.end) for m in marks]
    n = len(marks)
    step_s = sum(e.cpu_time_total for e in marks) / n / 1e6
    gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    compute: dict[str, float] = {}
    comm: dict[str, float] = {}
    if gpu:  # kernels: what the device did; the CPU side only issued them
        for e in gpu:
            _add(compute, comm, op_class(e.name), e.self_device_time_total / n / 1e6)
        exposed = _exposed_kernel_time(gpu, n)
    else:
        for e in events:
            mine = e.thread == thread and e.name != STEP_MARK and e.device_type == DeviceType.CPU
            if mine and any(a <= e.time_range.start and e.time_range.end <= b for a, b in spans):
                _add(compute, comm, op_class(e.name), e.self_cpu_time_total / n / 1e6)
        exposed = dict(comm)  # the step's own thread waits through every collective
    busy = sum(compute.values()) + sum(exposed.values())
    return Measured(
        steps=n,
        step_time_s=step_s,
        compute_by_class_s=dict(sorted(compute.items())),
        comm_s=dict(sorted(comm.items())),
        exposed_comm_s=dict(sorted(exposed.items())),
        host_s=max(0.0, step_s - busy),
        peak_memory_bytes=peak_memory,
    )


def _add(compute: dict, comm: dict, kind: str, seconds: float) -> None:
    if kind.startswith("comm:"):
        name = kind.removeprefix("comm:")
        comm[name] = comm.get(name, 0.0) + seconds
    else:
        compute[kind] = compute.get(kind, 0.0) + seconds


def _exposed_kernel_time(kernels: list, steps: int) -> dict[str, float]:
    """Per collective kind, its kernels' time that no compute kernel overlaps."""
    busy = sorted(
        (e.time_range.start, e.time_range.end)
        for e in kernels
        if not op_class(e.name).startswith("comm:")
    )
    out: dict[str, float] = {}
    for e in kernels:
        kind = op_class(e.name)
        if not kind.startswith("comm:"):
            continue
        start, end = e.time_range.start, e.time_range.end
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy if a < end)
        name = kind.removeprefix("comm:")
        out[name] = out.get(name, 0.0) + max(0.0, end - start - covered) / steps / 1e6
    return out


class StepProfiler:
    """Profiles steps ``first + 1 .. first + steps`` of a run (``first`` warms up), writes
    the traces and, on rank 0, the terms beside ``prediction``."""

    def __init__(self, run_dir: Path, rank: int, device: torch.device, steps: int) -> None:
        self.folder = make_dirs(run_dir / "profile")
        self.rank, self.device = rank, device
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
            on_trace_ready=self._write_trace,
        )
        self.done = self.reported = False
        self.measured: Measured | None = None

    def _write_trace(self, prof: profile) -> None:
        path = self.folder / f"trace_rank{self.rank}.json"
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        prof.export_chrome_trace(str(temp))
        os.replace(temp, path)
        self.measured = measure(list(prof.events()), peak_memory_bytes(self.device))
        self.done = True

    def __enter__(self) -> StepProfiler:
        self.profiler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.profiler.__exit__(*exc)

    def step(self) -> Any:
        """A context around one training step (the step mark the terms are cut by)."""
        return record_function(STEP_MARK)

    @property
    def recording(self) -> bool:
        """The step under way is traced (the warm-up step is, too)."""
        return not self.done

    def advance(self) -> None:
        if not self.done:
            self.profiler.step()

    def write_terms(self, prediction: Any) -> dict[str, Any] | None:
        """Rank 0: writes ``profile/terms.json``, the measured terms and the predicted
        ones, and returns what it wrote."""
        if self.rank != 0 or self.measured is None:
            return None
        predicted = None
        if prediction is not None:
            b = prediction.breakdown
            predicted = {
                "step_time_s": prediction.step_time_s,
                "compute_by_class_s": b.get("compute_by_class_s", {}),
                "recompute_s": b.get("recompute_s", 0.0),
                "bubble_s": b.get("bubble_s", 0.0),
                "optimizer_s": b.get("optimizer_s", 0.0),
                "exposed_comm_s": b.get("exposed_comm_s", {}),
                "comm_s": b.get("comm_s", {}),
                "memory_gib": prediction.memory_gib,
            }
        doc = {"measured": self.measured.to_dict(), "predicted": predicted,
               "trace": f"trace_rank{self.rank}.json"}  # fmt: skip
        write_text_atomic(self.folder / "terms.json", json.dumps(doc, indent=1) + "\n")
        return doc


def terms_table(doc: dict[str, Any]) -> list[str]:
    """The measured terms beside the predicted ones, one line each (seconds per step)."""
    m, p = doc["measured"], doc["predicted"] or {}
    rows = [("step", m["step_time_s"], p.get("step_time_s"))]
    classes = sorted(set(m["compute_by_class_s"]) | set(p.get("compute_by_class_s", {})))
    rows += [(f"compute: {c}", m["compute_by_class_s"].get(c, 0.0),
              p.get("compute_by_class_s", {}).get(c)) for c in classes]  # fmt: skip
    rows += [(f"exposed {k} (measured)", v, None) for k, v in m["exposed_comm_s"].items()]
    rows += [(f"exposed {k} (predicted)", None, v) for k, v in p.get("exposed_comm_s", {}).items()]
    rows += [("bubble", None, p.get("bubble_s")), ("host and other", m["host_s"], None)]

    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.4f}"

    lines = [f"{'term':<34}{'measured s':>12}{'predicted s':>13}"]
    lines += [f"{name:<34}{cell(a):>12}{cell(b):>13}" for name, a, b in rows]
    return lines
