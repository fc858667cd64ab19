"""GPU readiness: the GPU-only paths legato trains with, checked and timed on one device.

One process, one device, a few minutes (``run_all.sh`` gives it a deadline):

* ``process_group``: an NCCL group of one (gloo in the dry run): all-reduce, all-to-all
  (what expert parallelism sends), their result and time;
* ``cuda_streams``: a GEMM on a side stream while another runs on the default stream,
  joined by an event: the result equals the serial one, and the overlap ratio
  (both streams' wall time over the sum of the two alone; lower is better);
* ``gemm``: bf16 ``torch.mm`` TFLOP/s, and the tile-wise FP8 linear (``fp8_linear``,
  ``torch._scaled_mm`` on an FP8 GPU, the emulated GEMM elsewhere) against it: its error
  relative to bf16 and its time ratio (lower is better);
* ``moe_overlap``: one MoE layer's forward + backward with Comet's chunked
  dispatch-GEMM-combine (``Overlap.comet``) over the group of one against the plain
  schedule: equal outputs, time ratio (lower is better);
* ``multi_lora``: the fused multi-task LoRA linear (``fused_lora_linear``) against one
  ``F.linear`` plus a LoRA per task in a loop: equal outputs, time ratio (lower is better).

Every check writes the same keys with ``--dry-run`` (CPU, gloo, tiny shapes, a second or
so: what CI runs) as on the GPU: one JSON object, ``{"device", "dry_run", "elapsed_s",
"ok", "rows": [...]}``, each row a ``benchmarks/report.py`` row with ``ok`` added, also
printed one per line.

    python benchmarks/gpu/readiness.py --out readiness.json [--dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from legato.atomic import write_text_atomic
from legato.lora.fused_linear import fused_lora_linear
from legato.lora.segmented import Segment
from legato.moe import EPGroup, MoELayer, Overlap
from legato.precision import fp8_linear

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/report.py
from report import print_row, result_row

BENCHMARK = "gpu_readiness"


@dataclass(frozen=True)
class Sizes:
    """The shapes of one run: the GPU's, or the dry run's tiny ones."""

    gemm: int  # square GEMM side
    tokens: int  # rows of the MoE and LoRA inputs
    hidden: int
    tasks: int  # LoRA tasks packed in one batch
    rank: int  # LoRA rank
    repeats: int


GPU = Sizes(gemm=8192, tokens=8192, hidden=4096, tasks=8, rank=16, repeats=20)
DRY = Sizes(gemm=128, tokens=64, hidden=128, tasks=2, rank=4, repeats=2)


class Timer:
    """Median seconds of a callable: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats

    def __call__(self, fn: Callable[[], object]) -> float:
        fn()  # warm-up: kernels chosen, caches filled
        times = []
        for _ in range(self.repeats):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)).item()


def _row(case: str, metric: str, value, baseline=None, baseline_value=None, *, ok: bool, **extra):
    row = result_row(BENCHMARK, {"check": case}, metric, value, baseline, baseline_value,
                     digits=6, ratio_digits=4, ok=bool(ok), **extra)  # fmt: skip
    print_row(row)
    return row


def check_process_group(device: torch.device, sizes: Sizes, timer: Timer) -> list[dict]:
    x = torch.arange(sizes.tokens * sizes.hidden, device=device, dtype=torch.float32)
    want = x.clone()
    dist.all_reduce(x)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    seconds = timer(lambda: dist.all_reduce(x))
    ok = torch.equal(x, want) and torch.equal(out, want)
    return [_row("process_group", "all_reduce_s", seconds, ok=ok, backend=dist.get_backend())]


def check_streams(device: torch.device, sizes: Sizes, timer: Timer) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (
        torch.randn(sizes.gemm, sizes.gemm, device=device, dtype=dtype, generator=g) for _ in "ab"
    )
    side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def on_side(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if side is None:  # the CPU path: the same calls, one stream
            return fn()
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream(device).wait_stream(side)
        out.record_stream(torch.cuda.current_stream(device))
        return out

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        return on_side(lambda: a @ b), b @ a

    serial = (a @ b, b @ a)
    overlapped = both()
    ok = all(torch.equal(x, y) for x, y in zip(overlapped, serial, strict=True))
    alone = timer(lambda: a @ b) + timer(lambda: b @ a)
    return [_row("cuda_streams", "two_streams_s", timer(both), "one_after_other", alone, ok=ok)]


def check_gemm(device: torch.device, sizes: Sizes, timer: Timer) -> list[dict]:
    n = sizes.gemm
    g = torch.Generator(device=device).manual_seed(0)
    x, w = (torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16) for _ in "xw")
    bf16 = timer(lambda: F.linear(x, w))
    tflops = 2 * n**3 / bf16 / 1e12
    fp8 = timer(lambda: fp8_linear(x, w))
    error = _relative(fp8_linear(x, w), F.linear(x.float(), w.float()))
    backend = (
        "scaled_mm"
        if device.type == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
        else "emulated"
    )
    return [
        _row("gemm_bf16", "tflops", tflops, ok=tflops > 0, side=n),
        # e4m3 tiles: ~3% relative error per product, far less over a sum of n terms
        _row("gemm_fp8", "step_time_s", fp8, "bf16_linear", bf16, ok=error < 0.1,
             relative_error=round(error, 5), backend=backend),
    ]  # fmt: skip


def _moe_layer(device: torch.device, hidden: int) -> MoELayer:
    from legato.models.mlp import activate
    from legato.specs.model import MoESpec

    spec = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=2 * hidden)
    torch.manual_seed(0)
    layer = MoELayer(hidden, spec, gated=True, bias=False, activation=activate).to(device)
    layer.ep = EPGroup(dist.group.WORLD, 1, 0)  # the dispatch goes through the group
    return layer


def check_moe_overlap(device: torch.device, sizes: Sizes, timer: Timer) -> list[dict]:
    layer = _moe_layer(device, sizes.hidden)
    x = torch.randn(
        sizes.tokens,
        sizes.hidden,
        device=device,
        generator=torch.Generator(device=device).manual_seed(1),
    )
    autocast = (
        torch.autocast(device.type, torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )

    def step(overlap: Overlap) -> torch.Tensor:
        layer.overlap = overlap
        with autocast:
            out = layer(x)
        out.float().sum().backward()
        return out.detach()

    plain, comet = step(Overlap()), step(Overlap.comet(2, 2))
    error = _relative(comet, plain)
    seconds = {
        name: timer(lambda o=o: step(o))
        for name, o in (("plain", Overlap()), ("comet", Overlap.comet(2, 2)))
    }
    return [_row("moe_overlap", "step_time_s", seconds["comet"], "plain", seconds["plain"],
                 ok=error < 1e-2, relative_error=round(error, 6))]  # fmt: skip


def check_multi_lora(device: torch.device, sizes: Sizes, timer: Timer) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(2)
    h, r, per = sizes.hidden, sizes.rank, sizes.tokens // sizes.tasks
    x = torch.randn(sizes.tokens, h, device=device, dtype=dtype, generator=g)
    weight = torch.randn(h, h, device=device, dtype=dtype, generator=g) * h**-0.5
    factors = [(torch.randn(r, h, device=device, generator=g) * h**-0.5,
                torch.randn(h, r, device=device, generator=g) * r**-0.5) for _ in range(sizes.tasks)]  # fmt: skip
    segments = [Segment(i * per, (i + 1) * per, 2.0) for i in range(sizes.tasks)]

    def fused() -> torch.Tensor:
        return fused_lora_linear(x, weight, None, segments, factors)

    def loop() -> torch.Tensor:
        base = F.linear(x, weight)
        parts = [base[s.start : s.stop] + s.scale * F.linear(F.linear(x[s.start : s.stop], a.to(dtype)), b.to(dtype))
                 for s, (a, b) in zip(segments, factors, strict=True)]  # fmt: skip
        return torch.cat(parts)

    error = _relative(fused(), loop())
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    return [_row("multi_lora", "step_time_s", timer(fused), "loop_per_task", timer(loop),
                 ok=error < tolerance, relative_error=round(error, 7))]  # fmt: skip


CHECKS = [check_process_group, check_streams, check_gemm, check_moe_overlap, check_multi_lora]


@contextlib.contextmanager
def group_of_one(backend: str):
    """The default process group of this one process (NCCL on the GPU)."""
    with tempfile.TemporaryDirectory(prefix="legato-readiness-") as tmp:
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def run(dry_run: bool) -> dict:
    began = time.perf_counter()
    cuda = torch.cuda.is_available() and not dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not dry_run and not cuda:
        raise SystemExit("readiness: no CUDA device; use --dry-run for the CPU path")
    if cuda:
        torch.cuda.set_device(device)
    sizes = DRY if dry_run else GPU
    timer = Timer(device, sizes.repeats)
    rows = []
    with group_of_one("nccl" if cuda else "gloo"):
        for check in CHECKS:
            try:
                rows += check(device, sizes, timer)
            except Exception as exc:  # one failed path must not hide the others' figures
                rows.append(_row(check.__name__.removeprefix("check_"), "error", None, ok=False,
                                 error=f"{type(exc).__name__}: {exc}"[:500]))  # fmt: skip
    name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    elapsed = round(time.perf_counter() - began, 3)
    return {"device": name, "dry_run": dry_run, "elapsed_s": elapsed,
            "ok": all(r["ok"] for r in rows), "rows": rows}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny shapes")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    report = run(args.dry_run)
    write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
