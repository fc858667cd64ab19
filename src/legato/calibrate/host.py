"""``legato calibrate``: measure this host as its training processes see it.

``calibrate(nproc)`` starts ``nproc`` processes (``legato.parallel.launch``, gloo), each
with the thread count the trainer would give it (``cores / nproc``). Together they
measure compute at the same time, so they share cores, caches and memory bandwidth as in
training (``calibrate.matmul``, ``calibrate.compute``), then the collectives between them
(``calibrate.link``); ``cost.gemm_fit`` and ``cost.link_fit`` fit the cost model's laws
to the timings. ``calibrate.cluster_file`` turns the ``Measurement`` into a cluster file
and the cost model's constants for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from legato.calibrate import compute, link, matmul
from legato.devices.gemm_fit import GemmFit, GemmTiming, fit_gemm_rate
from legato.devices.link_fit import CommTiming, LinkFit, fit_alpha_beta
from legato.errors import ConfigError
from legato.parallel.launch import INTERRUPTED, launch
from legato.parallel.process_group import process_group, set_threads
from legato.specs.typed import from_dict


@dataclass(frozen=True)
class Budget:
    """What to measure and for how long (seconds per process; the processes run at once).
    Each figure is the median of ``repeats`` trials."""

    gemm_shapes: tuple[tuple[int, int, int], ...]
    gemm_s: float
    bf16_s: float
    cold_bytes: int  # working set beyond the caches: GEMM operands, copies
    memory_s: float
    attention_shapes: tuple[tuple[int, int, int, int], ...]
    attention_s: float
    comm_sizes: tuple[int, ...]
    comm_s: float
    repeats: int


FULL = Budget(
    gemm_shapes=matmul.GEMM_SHAPES,
    gemm_s=4.0,
    bf16_s=2.0,
    cold_bytes=matmul.COLD_BYTES,
    memory_s=2.0,
    attention_shapes=compute.ATTENTION_SHAPES,
    attention_s=2.0,
    comm_sizes=link.SIZES,
    comm_s=5.0,
    repeats=5,
)
QUICK = Budget(
    gemm_shapes=matmul.QUICK_GEMM_SHAPES,
    gemm_s=0.5,
    bf16_s=0.3,
    cold_bytes=matmul.COLD_BYTES // 4,
    memory_s=0.4,
    attention_shapes=compute.ATTENTION_SHAPES[:1],
    attention_s=0.3,
    comm_sizes=link.QUICK_SIZES,
    comm_s=0.8,
    repeats=3,
)
# bf16 shapes are measured only when a 512^3 bf16 product runs at least this share of the
# fp32 rate (CPUs without bf16 matrix units emulate it slowly); else the probe is the peak.
BF16_MIN_SHARE = 0.25


@dataclass(frozen=True)
class Measurement:
    """What ``calibrate`` measured: medians per process (averaged over the processes,
    which measured at the same time). Rates in FLOP/s and bytes/s; ``parallel_overhead_s``
    is what a multi-threaded eager kernel pays for its threads (0 with one thread)."""

    nproc: int
    threads: int
    quick: bool
    host: str
    gemm: list[GemmTiming]
    gemm_fit: GemmFit
    bf16_gemm: list[GemmTiming]
    bf16_peak_flops: float
    copy_bandwidth: float
    elementwise_bandwidth: float
    parallel_overhead_s: float
    attention_rate: float
    comm: list[CommTiming] = field(default_factory=list)
    link: LinkFit | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def _reporter(enabled: bool, start: float) -> Callable[[str], None]:
    """Progress lines on stderr, stamped with the seconds since ``start`` (``time.time``:
    the spawned processes share the parent's clock)."""

    def say(text: str) -> None:
        if enabled:
            elapsed = time.time() - start
            print(f"calibrate [{elapsed:5.1f} s] {text}", file=sys.stderr, flush=True)

    return say


def _measure_compute(budget: Budget, say: Callable[[str], None]) -> dict[str, Any]:
    """This process's compute figures (a plain dict, to gather over processes)."""
    threads = torch.get_num_threads()
    say(f"GEMM fp32, {len(budget.gemm_shapes)} shapes, {threads} thread(s) per process")
    r = budget.repeats
    cold = budget.cold_bytes
    gemm = matmul.measure_gemms(budget.gemm_shapes, "fp32", budget.gemm_s, r, cold)
    probe = (512, 512, 512)
    (bf16_probe,) = matmul.measure_gemms([probe], "bf16", budget.bf16_s / 4, r, cold)
    bf16: list[GemmTiming] = []
    if bf16_probe.rate >= BF16_MIN_SHARE * fit_gemm_rate(gemm).rate(*probe):
        say(f"GEMM bf16, {len(budget.gemm_shapes)} shapes")
        bf16 = matmul.measure_gemms(budget.gemm_shapes, "bf16", budget.bf16_s * 3 / 4, r, cold)
    else:
        say(f"GEMM bf16 skipped: {bf16_probe.rate / 1e9:.1f} GFLOP/s at 512^3 (emulated)")
    say("memory: copy and elementwise bandwidth, multi-threaded kernel overhead")
    copy = compute.measure_copy_bandwidth(cold, budget.memory_s / 3, r)
    elementwise = compute.measure_elementwise_bandwidth(cold // 4, budget.memory_s / 3, r)
    parallel = compute.measure_parallel_overhead(budget.memory_s / 3, r)
    say(f"attention, {len(budget.attention_shapes)} shape(s)")
    attention = compute.measure_attention_rate(budget.attention_shapes, budget.attention_s, r)
    return {
        "threads": threads,
        "gemm": [t.seconds for t in gemm],
        "bf16": [t.seconds for t in bf16],
        "bf16_probe": bf16_probe.rate,
        "copy": copy,
        "elementwise": elementwise,
        "parallel_overhead": parallel,
        "attention": attention,
    }


def _combine(
    per_rank: list[dict[str, Any]], budget: Budget, nproc: int, quick: bool
) -> Measurement:
    """Average the processes' figures (they ran at the same time) and fit the GEMM model."""

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in per_rank)

    def timings(key: str, dtype: str) -> list[GemmTiming]:
        if not per_rank[0][key]:
            return []
        seconds = [statistics.fmean(s) for s in zip(*(r[key] for r in per_rank), strict=True)]
        shapes = budget.gemm_shapes
        return [GemmTiming(*shape, dtype, t) for shape, t in zip(shapes, seconds, strict=True)]

    gemm, bf16 = timings("gemm", "fp32"), timings("bf16", "bf16")
    return Measurement(
        nproc=nproc,
        threads=per_rank[0]["threads"],
        quick=quick,
        host=_cpu_name(),
        gemm=gemm,
        gemm_fit=fit_gemm_rate(gemm),
        bf16_gemm=bf16,
        bf16_peak_flops=fit_gemm_rate(bf16).peak_flops if bf16 else mean("bf16_probe"),
        copy_bandwidth=mean("copy"),
        elementwise_bandwidth=mean("elementwise"),
        parallel_overhead_s=mean("parallel_overhead"),
        attention_rate=mean("attention"),
    )


def comm_line(t: CommTiming) -> str:
    """One collective's timing as a progress / comment line."""
    return f"  {t.kind:<14} {t.nbytes / 1024:>8.0f} KiB  {t.seconds * 1e6:>9.1f} us"


def calibrate(nproc: int = 2, *, quick: bool = False, verbose: bool = True) -> Measurement:
    """Measure this host for ``nproc`` training processes (about 30 s; ``quick``: a few)."""
    if nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {nproc}")
    started = time.perf_counter()
    budget = QUICK if quick else FULL
    say = _reporter(verbose, time.time())
    if nproc == 1:
        previous = torch.get_num_threads()
        set_threads(1)
        try:
            figures = _measure_compute(budget, say)
        finally:
            torch.set_num_threads(previous)
        measurement = _combine([figures], budget, 1, quick)
    else:
        say(f"starting {nproc} processes")
        with tempfile.TemporaryDirectory(prefix="legato-calibrate-") as tmp:
            out = os.path.join(tmp, "measurement.json")
            args = [str(int(quick)), str(int(verbose)), repr(time.time()), out]
            code = launch(nproc, ["-m", "legato.calibrate.host", *args])
            if code == INTERRUPTED:
                raise KeyboardInterrupt
            if code:
                raise SystemExit(code)  # the launcher said which worker failed, and how
            data = json.loads(Path(out).read_text(encoding="utf-8"))
        measurement = from_dict(Measurement, data, "measurement", ConfigError)
    return dataclasses.replace(measurement, seconds=time.perf_counter() - started)


def _worker(quick: bool, verbose: bool, start: float, out: str) -> None:
    """One launched process: measure compute with the others, then the collectives."""
    budget = QUICK if quick else FULL
    with process_group("gloo", "cpu") as ctx:  # its thread count: cores / nproc
        ctx.barrier()
        say = _reporter(verbose and ctx.is_main, start)
        figures = _measure_compute(budget, say)
        say(f"collectives between {ctx.world_size} processes, {len(budget.comm_sizes)} sizes each")
        timings = link.measure_collectives(budget.comm_sizes, budget.comm_s, repeats=budget.repeats)
        for timing in timings:
            say(comm_line(timing))
        gathered = ctx.all_gather_object(figures)
        if ctx.is_main:
            measurement = _combine(gathered, budget, ctx.world_size, quick)
            measurement = dataclasses.replace(
                measurement, comm=timings, link=fit_alpha_beta(timings)
            )
            Path(out).write_text(json.dumps(measurement.to_dict()), encoding="utf-8")


if __name__ == "__main__":
    try:
        _worker(sys.argv[1] == "1", sys.argv[2] == "1", float(sys.argv[3]), sys.argv[4])
    except KeyboardInterrupt:  # Ctrl-C: the parent says so, once
        sys.exit(INTERRUPTED)
