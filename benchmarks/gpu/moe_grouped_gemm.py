"""GPU check of the MoE expert GEMMs (H100/H200): grouped GEMM vs a loop over experts, the
efficiency of chunked expert GEMMs by chunk count, and the CUDA paths of ``legato.moe``.

1. ``torch._grouped_mm`` (bf16) against a loop of per-expert matmuls, forward + backward,
   on Mixtral-8x7B-like (8 experts, h 4096, ffn 14336) and DeepSeek-V3-like (8 local
   experts of 256 at EP 32, h 7168, ffn 2048) shapes: ``step_time_s``, lower is better,
   ``ratio = grouped / loop``.
2. Chunked expert GEMMs (what Comet's chunks cost): the rows of each expert split into
   1, 2, 4, 8, 16 chunks, each a separate grouped GEMM; ``tflops`` per chunk count and
   ``ratio`` to the unchunked GEMM (higher is better for ``tflops``).
3. Correctness on the device: the layer with ``torch._grouped_mm`` equals the loop, and
   the expert-parallel code path (a one-rank NCCL group: all-to-alls to itself issued from
   the side stream) equals the plain layer for every overlap schedule.

Run on a machine with a CUDA GPU: ``python benchmarks/gpu/moe_grouped_gemm.py [--quick]``.
Without one it says so and exits 0. JSON lines, one per measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch
from cuda_timing import cuda_median_seconds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/report.py
from report import emit, note

BENCHMARK = "moe_grouped_gemm"

SHAPES = {  # name -> (local experts, hidden, ffn, rows per expert)
    "mixtral-8x7b-ep8": (1, 4096, 14336, 4096),
    "mixtral-8x7b-ep1": (8, 4096, 14336, 1024),
    "deepseek-v3-ep32": (8, 7168, 2048, 1024),
}


def _gemm_step(x, w, sizes, impl, grad) -> None:
    from legato.moe import grouped_mm

    grouped_mm(x, w, sizes, impl).backward(grad)


def _chunked(parts, w, sizes) -> None:
    from legato.moe import grouped_mm

    for part in parts:
        grouped_mm(part, w, sizes, "grouped_mm")


def grouped_vs_loop(repeats: int, shapes: dict) -> None:
    from legato.moe import grouped_mm_supported

    for name, (experts, hidden, ffn, rows) in shapes.items():
        x = torch.randn(experts * rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, ffn, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5
        x.requires_grad_()
        w.requires_grad_()
        sizes = [rows] * experts
        grad = torch.randn(experts * rows, ffn, device="cuda", dtype=torch.bfloat16)
        times = {
            impl: cuda_median_seconds(
                partial(_gemm_step, x, w, sizes, impl, grad), repeats, warmup=2
            )
            for impl in ("loop", "grouped_mm")
        }
        flops = 3 * 2 * experts * rows * hidden * ffn
        emit(
            BENCHMARK,
            case={"shape": name, "experts": experts, "hidden": hidden, "ffn": ffn, "rows": rows},
            supported=grouped_mm_supported(x, w),
            metric="step_time_s",
            value=times["grouped_mm"],
            baseline="loop_over_experts",
            baseline_value=times["loop"],
            ratio=times["grouped_mm"] / times["loop"],
            tflops=flops / times["grouped_mm"] / 1e12,
        )


def chunk_efficiency(repeats: int, shapes: dict) -> None:
    for name, (experts, hidden, ffn, rows) in shapes.items():
        x = torch.randn(experts * rows, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(experts, ffn, hidden, device="cuda", dtype=torch.bfloat16)
        flops = 2 * experts * rows * hidden * ffn
        base = None
        for chunks in (1, 2, 4, 8, 16):
            per = rows // chunks
            parts = [x[c * per * experts : (c + 1) * per * experts] for c in range(chunks)]
            seconds = cuda_median_seconds(
                partial(_chunked, parts, w, [per] * experts), repeats, warmup=2
            )
            tflops = flops / seconds / 1e12
            base = base or tflops
            emit(
                BENCHMARK,
                case={"shape": name, "chunks": chunks, "rows_per_expert_chunk": per},
                metric="tflops",
                value=tflops,
                baseline="one_chunk",
                baseline_value=base,
                ratio=tflops / base,
            )


def _layer(hidden: int):
    from legato.models.mlp import activate
    from legato.moe import MoELayer
    from legato.specs.model import MoESpec

    spec = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=2 * hidden)
    layer = MoELayer(hidden, spec, gated=True, bias=False, activation=activate)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * hidden**-0.5)
    return layer.cuda().bfloat16()


def _run(layer, x, grad):
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(grad)
    return out.detach().float(), x.grad.float(), layer.experts.up_proj.grad


def correctness() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from legato.moe import Overlap
    from legato.parallel.expert import apply_expert_parallel

    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn_like(x)
    reference = _layer(256)
    reference.experts.gemm_impl = "loop"
    expected = _run(reference, x, grad)
    grouped = _layer(256)
    grouped.experts.gemm_impl = "grouped_mm"
    _check("grouped_mm_vs_loop", _run(grouped, x, grad), expected)

    with tempfile.TemporaryDirectory() as tmp:
        store = f"file://{os.path.join(tmp, 'store')}"
        dist.init_process_group("nccl", init_method=store, rank=0, world_size=1)
        try:
            mesh = init_device_mesh("cuda", (1,))
            for overlap in (Overlap(), Overlap.domino(), Overlap.comet(2, 2), Overlap.comet(4, 4)):
                layer = _layer(256)
                apply_expert_parallel(layer, mesh, overlap)
                found = _run(layer, x, grad)
                grads = (found[0], found[1], found[2].full_tensor())
                _check(
                    f"ep_nccl_{overlap.schedule}_c{overlap.chunks}_g{overlap.groups}",
                    grads,
                    expected,
                )
        finally:
            dist.destroy_process_group()


def _check(name: str, found, expected) -> None:
    errors = [
        float((a.float() - b.float()).abs().max()) for a, b in zip(found, expected, strict=True)
    ]
    scale = [float(b.float().abs().max()) for b in expected]
    ok = all(e <= 2e-2 * max(s, 1.0) for e, s in zip(errors, scale, strict=True))
    emit(BENCHMARK, case={"check": name}, metric="max_abs_error", value=max(errors), ok=ok)
    if not ok:
        raise AssertionError(f"{name}: errors {errors} exceed bf16 tolerance")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one shape, few repeats")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("moe_grouped_gemm: no CUDA GPU available; this benchmark needs an H100/H200.")
        return 0
    capability = torch.cuda.get_device_capability()
    print(f"# device: {torch.cuda.get_device_name()} (sm{capability[0]}{capability[1]})")
    if capability < (9, 0):
        print("# note: legato uses torch._grouped_mm on sm90+ only; the loop runs elsewhere")
    repeats = 5 if args.quick else 20
    shapes = dict(list(SHAPES.items())[:1]) if args.quick else SHAPES
    failed = []
    for section in (
        correctness,
        lambda: grouped_vs_loop(repeats, shapes),
        lambda: chunk_efficiency(repeats, shapes),
    ):
        try:
            section()
        except Exception as error:  # report and go on with the other sections
            failed.append(error)
            note(BENCHMARK, error=f"{type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
