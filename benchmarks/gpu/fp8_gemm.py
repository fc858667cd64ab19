"""FP8 tile-wise GEMM and a ~1B model step on an FP8 GPU (H100/H200), vs bf16 and torchao.

Prepared for a machine with CUDA; without one it prints a ``skipped`` line and exits 0.

1. ``check``: our block-scaled path (``F.scaled_mm``, 1x128 x 128x128 scales) against the
   emulated tile-wise GEMM on the same FP8 operands (relative difference; bf16 output
   rounding gives ~2e-3),
   and whether the block-scaled kernel ran or the emulated fallback was used.
2. ``gemm_tflops`` per shape (higher is better): tile-wise FP8 GEMM on pre-quantised
   operands; ``baseline`` bf16 ``torch.mm``; ``extra`` has the tile-wise linear forward
   including quantisation, and torchao's row-wise ``Float8Linear`` forward when torchao
   imports (both include quantisation).
3. ``step_time_s`` of a ~1B Llama-style model (forward + backward, median; lower is
   better): all block linears in tile-wise FP8 vs bf16, and torchao row-wise in ``extra``.
   ``--compile`` wraps our quantisation in ``torch.compile`` (eager it is several kernels).

    python benchmarks/gpu/fp8_gemm.py [--quick] [--compile]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import cuda_median_seconds

import legato.precision.linear as fp8_linear_module
from legato.models import build_model
from legato.precision import convert_to_fp8, fp8_linear, quantize_tiles
from legato.precision.gemm import _scaled_mm, emulated_mm
from legato.specs.model import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/report.py
from report import emit, note

BENCHMARK = "fp8_gemm"

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096)]
MODEL_1B = ModelSpec(
    name="llama-1b-bench",
    hidden_size=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=8192,
    vocab_size=32768,
    seq_len=4096,
)


def _torchao_rowwise(module: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    return convert_to_float8_training(module, config=Float8LinearConfig.from_recipe_name("rowwise"))


def check(device: torch.device) -> bool:
    a = quantize_tiles(torch.randn(512, 1024, device=device), (1, 128))
    b = quantize_tiles(torch.randn(768, 1024, device=device), (128, 128))
    ref = emulated_mm(a, b, torch.float32)
    try:
        got = _scaled_mm(a, b, torch.bfloat16).float()  # cuBLASLt block scaling: bf16 out
    except (RuntimeError, NotImplementedError, ValueError) as err:
        note(BENCHMARK, metric="check", block_scaled_kernel=False, error=str(err)[:300])
        return False
    rel = float((got - ref).norm() / ref.norm())
    note(BENCHMARK, metric="check", block_scaled_kernel=True, rel_diff_vs_emulated=rel)
    return True


def gemm_rows(device: torch.device, shapes) -> None:
    for m, k, n in shapes:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        flops = 2 * m * n * k
        xq, wq = quantize_tiles(x, (1, 128)), quantize_tiles(w, (128, 128))
        t_bf16 = cuda_median_seconds(lambda x=x, w=w: torch.mm(x, w.T), repeats=20, warmup=3)
        t_tile = cuda_median_seconds(
            lambda xq=xq, wq=wq: _scaled_mm(xq, wq, torch.bfloat16), repeats=20, warmup=3
        )
        t_linear = cuda_median_seconds(
            lambda x=x, w=w: fp8_linear(x, w, backend="scaled_mm"), repeats=20, warmup=3
        )
        extra = {"tilewise_linear_with_quant_tflops": flops / t_linear / 1e12}
        layer = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False, device=device))
        layer = layer.to(torch.bfloat16)
        ao = _torchao_rowwise(layer)
        if ao is not None:
            t_ao = cuda_median_seconds(lambda x=x, ao=ao: ao(x), repeats=20, warmup=3)
            extra["torchao_rowwise_linear_with_quant_tflops"] = flops / t_ao / 1e12
        emit(
            BENCHMARK,
            case={"m": m, "k": k, "n": n},
            metric="gemm_tflops",
            value=flops / t_tile / 1e12,
            baseline="bf16_mm",
            baseline_value=flops / t_bf16 / 1e12,
            ratio=t_bf16 / t_tile,
            extra=extra,
        )


def step_rows(device: torch.device, batch: int, seq: int) -> None:
    spec = MODEL_1B.with_(seq_len=seq)
    base = build_model(spec, seed=0, device=device, dtype=torch.bfloat16)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), device=device)

    def step_time(model) -> float:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            logits = model(ids)
            F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten()).backward()

        return cuda_median_seconds(run, repeats=10, warmup=3)

    t_bf16 = step_time(base)
    fp8 = copy.deepcopy(base)
    convert_to_fp8(fp8, "tilewise", backend="scaled_mm")
    t_fp8 = step_time(fp8)
    extra = {}
    ao = _torchao_rowwise(copy.deepcopy(base))
    if ao is not None:
        extra["torchao_rowwise_step_s"] = step_time(ao)
    emit(
        BENCHMARK,
        case={"model": "llama-1b", "batch": batch, "seq": seq},
        metric="step_time_s",
        value=t_fp8,
        baseline="bf16",
        baseline_value=t_bf16,
        ratio=t_fp8 / t_bf16,
        extra=extra,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one GEMM shape, a short step")
    parser.add_argument("--compile", action="store_true", help="torch.compile the quantiser")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        note(BENCHMARK, skipped="no CUDA GPU here; run this on an H100/H200 (FP8 needs sm89+)")
        return
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 9):
        note(BENCHMARK, skipped=f"{torch.cuda.get_device_name(device)} has no FP8 tensor cores")
        return
    if args.compile:
        fp8_linear_module.quantize_tiles = torch.compile(quantize_tiles, dynamic=True)
    note(
        BENCHMARK, metric="device", name=torch.cuda.get_device_name(device), torch=torch.__version__
    )
    if not check(device):
        print("block-scaled FP8 GEMM unavailable; GEMM figures would be emulated", file=sys.stderr)
    gemm_rows(device, SHAPES[:1] if args.quick else SHAPES)
    step_rows(device, batch=1 if args.quick else 2, seq=2048 if args.quick else 4096)


if __name__ == "__main__":
    main()
