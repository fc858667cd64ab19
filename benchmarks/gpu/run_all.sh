#!/usr/bin/env bash
# GPU readiness on one GPU in under 8 minutes, JSON out:
#   readiness.py            NCCL group of one, CUDA streams, bf16 and FP8 GEMMs, the MoE
#                           overlap and the multi-LoRA kernel (one JSON object)
#   fp8_gemm.py --quick     tile-wise FP8 against bf16 (and torchao) on a ~1B model step
#   moe_grouped_gemm.py --quick   grouped expert GEMM against a loop, and its correctness
# Each runs under its own deadline (240 + 90 + 90 s, with start-up well under 8 minutes);
# a failed or timed-out part is recorded and the others still run; exit 1 if any failed.
#
#   benchmarks/gpu/run_all.sh [--dry-run] [OUT_DIR]    (default OUT_DIR: gpu-readiness)
#
# --dry-run: readiness.py only, on the CPU with gloo and tiny shapes (seconds; CI runs it).
# PYTHON picks the interpreter (default: python).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python}
dry=()
if [ "${1:-}" = "--dry-run" ]; then dry=(--dry-run); shift; fi
out=${1:-gpu-readiness}
mkdir -p "$out"
status=0
timeout 240 "$python" "$here/readiness.py" "${dry[@]}" --out "$out/readiness.json" || status=1
if [ ${#dry[@]} -eq 0 ]; then
  timeout 90 "$python" "$here/fp8_gemm.py" --quick > "$out/fp8_gemm.jsonl" || status=1
  timeout 90 "$python" "$here/moe_grouped_gemm.py" --quick > "$out/moe_grouped_gemm.jsonl" || status=1
fi
echo "gpu readiness: $out (exit $status)"
exit $status
