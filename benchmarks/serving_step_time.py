"""The serving simulator's step-time model (``serve/step_time.py``) against the published
per-op micro data it was not built from: one decoder layer's ops except attention
(Vidur's ``serving_vidur_llama_layer_op_times.csv``: GEMMs, norms, rotary, activation,
adds, by token count, per model and TP degree) and cuDNN's paged GQA attention
(``attention_serving_cudnn_paged_gqa.csv``, decode and prefill), per device.

The step-time model fits nothing: it prices each op with the device profile
(``legato.devices``), whose GEMM law was fitted by the device-profile work on Vidur's
GEMM sweep (``gemm_vidur_llama_linear_layers.csv``, the same models' linear layers, with
its own held-out error in the profile file) — so the layer rows test the composition
(which GEMMs, which memory-bound ops, their shapes) on a file the fit did not read, and the
attention rows test the decode law (KV bytes over the profile's HBM bandwidth), which no fit
saw. Prints one JSON line per device and model/config: the median and mean absolute
error in percent (lower is better) and the row count.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from statistics import mean, median

from legato.devices import profile_for
from legato.serve.step_time import BatchRow, StepTimeModel
from legato.specs.registry import load_device, load_model

MICRO = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "micro"
MODELS = {"Llama-2-7b-hf": "llama2-7b", "Llama-2-70b-hf": "llama2-70b",
          "Meta-Llama-3-8B": "llama3-8b", "Meta-Llama-3-70B": "llama3-70b"}  # fmt: skip
DEVICES = {"A100-80GB": "a100-80g", "H100-80GB": "h100"}
ATTENTION_DEVICES = {"NVIDIA A100 80GB PCIe": "a100-80g", "NVIDIA H200": "h200"}
LAYER_OPS = ("input_layernorm_us", "attn_pre_proj_us", "attn_rope_us", "attn_post_proj_us",
             "post_attention_layernorm_us", "mlp_up_proj_us", "mlp_act_us",
             "mlp_down_proj_us", "add_us")  # fmt: skip


def _err(pred: float, real: float) -> float:
    return abs(pred - real) / real * 100


def layer_errors(folder: Path) -> list[dict]:
    groups: dict[tuple, list[float]] = {}
    models: dict[tuple, StepTimeModel] = {}
    with open(folder / "serving_vidur_llama_layer_op_times.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["gpu"] not in DEVICES or r["model"] not in MODELS:
                continue
            key = (DEVICES[r["gpu"]], MODELS[r["model"]], int(r["tp"]))
            if key not in models:
                device = load_device(key[0])
                models[key] = StepTimeModel(load_model(key[1]), device, profile_for(device),
                                            key[2])  # fmt: skip
            real = sum(float(r[c]) for c in LAYER_OPS) * 1e-6
            pred = models[key].layer_linear_time(int(r["num_tokens"]))
            groups.setdefault(key, []).append(_err(pred, real))
    return [{"benchmark": "serving_step_time", "part": "layer_ops", "device": d,
             "model": m, "tp": tp, "rows": len(e), "median_abs_err_pct": median(e),
             "mean_abs_err_pct": mean(e)} for (d, m, tp), e in sorted(groups.items())]  # fmt: skip


def attention_errors(folder: Path) -> list[dict]:
    groups: dict[tuple, list[float]] = {}
    spec = load_model("llama3-8b")
    with open(folder / "attention_serving_cudnn_paged_gqa.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["gpu"] not in ATTENTION_DEVICES:
                continue
            name = ATTENTION_DEVICES[r["gpu"]]
            device = load_device(name)
            heads, kv_heads, hd = int(r["num_q_heads"]), int(r["num_kv_heads"]), int(r["head_dim"])
            shaped = spec.with_(num_heads=heads, num_kv_heads=kv_heads, head_dim=hd,
                                hidden_size=heads * hd)  # fmt: skip
            model = StepTimeModel(shaped, device, profile_for(device))
            batch, q, kv = int(r["batch_size"]), int(r["q_tokens"]), int(r["kv_len"])
            rows = [BatchRow(q, kv - q)] * batch
            pred = model.attention_time(rows)
            phase = r["phase"].split()[0]
            key = (name, phase, r["config"])
            groups.setdefault(key, []).append(_err(pred, float(r["time_ms"]) * 1e-3))
    return [{"benchmark": "serving_step_time", "part": f"attention_{p}", "device": d,
             "config": c, "rows": len(e), "median_abs_err_pct": median(e),
             "mean_abs_err_pct": mean(e)} for (d, p, c), e in sorted(groups.items())]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=Path, default=MICRO, help="the micro data folder")
    parser.add_argument("--quick", action="store_true", help="(the whole run is quick)")
    args = parser.parse_args()
    for line in layer_errors(args.micro) + attention_errors(args.micro):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
