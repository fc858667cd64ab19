"""Rows of the micro-benchmark files the profiles are fitted on, as typed measurements.

Two formats a user writes too (docs/cost_model.md): a GEMM sweep, CSV with columns ``m, n,
k, dtype, time_us`` and an optional ``group`` (shapes fitted or held out together, e.g.
one model's layers), and nccl-tests output (``nccl_tests``). The published files of
``../shared/calibration/micro/`` (its README names every source and licence) are read by
their own column names; ``gpu`` labels map to device presets in ``fit_profiles.GPUS``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from legato.devices.link_fit import CommTiming
from legato.errors import DataError


@dataclass(frozen=True)
class GemmRow:
    m: float
    n: float
    k: float
    dtype: str
    seconds: float
    group: str = ""
    count: float = 1.0


def _rows(path: Path) -> Iterator[dict[str, str]]:
    """The rows of CSV ``path``; none when the folder lacks that file (a partial copy)."""
    if not path.exists():
        return
    try:
        with open(path, newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


GEMM_COLUMNS = ("m", "n", "k", "dtype", "time_us")


def read_gemm_csv(path: str | Path) -> list[GemmRow]:
    """A GEMM sweep in legato's CSV format (columns ``GEMM_COLUMNS`` and optional
    ``group``); DataError naming the line of a bad row."""
    rows = []
    for i, r in enumerate(_rows(Path(path)), start=2):
        missing = [c for c in GEMM_COLUMNS if not r.get(c)]
        if missing:
            raise DataError(f"{path}:{i}: column {missing[0]} is missing or empty")
        try:
            row = GemmRow(float(r["m"]), float(r["n"]), float(r["k"]), r["dtype"],
                          float(r["time_us"]) * 1e-6, r.get("group") or "")  # fmt: skip
        except ValueError as exc:
            raise DataError(f"{path}:{i}: {exc}") from None
        if min(row.m, row.n, row.k, row.seconds) <= 0:
            raise DataError(f"{path}:{i}: m, n, k and time_us must be > 0")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no GEMM rows")
    return rows


def vidur_gemm(folder: Path, gpu: str) -> list[GemmRow]:
    """Vidur's fp16 linear layers (``gemm_vidur_llama_linear_layers.csv``), grouped by
    model and TP degree."""
    return [
        GemmRow(
            float(r["m"]),
            float(r["n"]),
            float(r["k"]),
            "fp16",
            float(r["time_us_median"]) * 1e-6,
            f"{r['model']} tp{r['tp']}",
        )
        for r in _rows(folder / "gemm_vidur_llama_linear_layers.csv")
        if r["gpu"] == gpu
    ]


def published_gemm(folder: Path, gpus: tuple[str, ...]) -> list[GemmRow]:
    """``gemm_published_tables.csv`` rows of ``gpus`` as times (``2 m n k groups /
    tflops``), grouped by library."""
    out = []
    for r in _rows(folder / "gemm_published_tables.csv"):
        if r["gpu"] not in gpus:
            continue
        m, n, k = float(r["m"]), float(r["n"]), float(r["k"])
        groups = float(r["groups"] or 1)
        dtype = "fp8" if r["dtype"].startswith("fp8") else r["dtype"]
        seconds = 2 * m * n * k * groups / (float(r["tflops"]) * 1e12)
        out.append(GemmRow(m, n, k, dtype, seconds, r["library"], groups))
    return out


@dataclass(frozen=True)
class AttentionRow:
    batch: float
    q: float
    kv: float
    heads: float
    kv_heads: float
    head_dim: float
    causal: bool
    dtype: str
    backward: bool
    seconds: float
    group: str


def paged_attention(folder: Path, gpu: str) -> list[AttentionRow]:
    """cuDNN paged GQA attention (``attention_serving_cudnn_paged_gqa.csv``): decode and
    prefill, bf16; a prefill row is causal over its new tokens."""
    return [
        AttentionRow(float(r["batch_size"]), float(r["q_tokens"]), float(r["kv_len"]),
                     float(r["num_q_heads"]), float(r["num_kv_heads"]), float(r["head_dim"]),
                     r["phase"].startswith("prefill"), "bf16", False,
                     float(r["time_ms"]) * 1e-3, f"{r['phase'].split()[0]} {r['config']}")
        for r in _rows(folder / "attention_serving_cudnn_paged_gqa.csv") if r["gpu"] == gpu
    ]  # fmt: skip


def training_attention(folder: Path, gpu: str) -> list[AttentionRow]:
    """cuDNN SDPA training rows of ``attention_sdpa_flash_published.csv`` (fwd and bwd,
    bf16 and fp8) on ``gpu``."""
    out = []
    for r in _rows(folder / "attention_sdpa_flash_published.csv"):
        if r["gpu"] != gpu or r["pass"] not in ("fwd", "bwd") or not r["time_ms"]:
            continue
        dtype = "fp8" if r["dtype"].startswith("fp8") else "bf16"
        out.append(AttentionRow(
            float(r["batch"]), float(r["seqlen_q"]), float(r["seqlen_kv"]),
            float(r["num_q_heads"]), float(r["num_kv_heads"]), float(r["head_dim_qk"]),
            r["causal"].startswith("True"), dtype, r["pass"] == "bwd",
            float(r["time_ms"]) * 1e-3, f"training d{r['head_dim_qk']}",
        ))  # fmt: skip
    return out


def babelstream(folder: Path, gpu: str) -> dict[str, float]:
    """BabelStream bandwidth (GB/s) by kernel."""
    rows = _rows(folder / "memory_hbm_babelstream_azure.csv")
    return {r["kernel"]: float(r["bandwidth_tbs"]) * 1e3 for r in rows if r["gpu"] == gpu}


def stream_best(folder: Path, gpu: str) -> dict[str, float]:
    """gpu-stream: each kernel's best bandwidth (GB/s) over the occupancy scan."""
    best: dict[str, float] = {}
    for r in _rows(folder / "memory_gpu_stream_vs_occupancy.csv"):
        if r["gpu"] == gpu:
            best[r["kernel"]] = max(best.get(r["kernel"], 0.0), float(r["bandwidth_gbs"]))
    return best


def host_copies(folder: Path, gpus: tuple[str, ...]) -> dict[str, list[float]]:
    """Host-to-device and device-to-host GB/s (nvbandwidth) by direction."""
    out: dict[str, list[float]] = {"h2d": [], "d2h": []}
    for r in _rows(folder / "p2p_host_device_bandwidth.csv"):
        test = r["test"].lower()
        if r["gpu"] in gpus and ("host to device" in test or "host_to_device" in test):
            out["h2d"].append(float(r["bandwidth_gbs"]))
        elif r["gpu"] in gpus and ("device to host" in test or "device_to_host" in test):
            out["d2h"].append(float(r["bandwidth_gbs"]))
    return out


def vidur_collectives(folder: Path, system: str, nodes: int) -> list[CommTiming]:
    """Vidur's torch.distributed NCCL sweeps of ``system`` over ``nodes`` nodes
    (all-reduce; send_recv as p2p)."""
    return [
        CommTiming("p2p" if r["op"] == "send_recv" else r["op"], int(r["size_bytes"]),
                   int(r["n_gpus"]), float(r["time_us_median"]) * 1e-6)
        for r in _rows(folder / "collectives_vidur_torch_nccl.csv")
        if r["system"] == system and int(r["n_nodes"]) == nodes
    ]  # fmt: skip


def nccl_tests_published(folder: Path, gpus: tuple[str, ...], nodes: int) -> list[CommTiming]:
    """Sweeps of ``collectives_nccl_tests_published.csv`` (rows with a time, or a bus
    bandwidth to derive one from) over ``nodes`` nodes."""
    out = []
    for r in _rows(folder / "collectives_nccl_tests_published.csv"):
        if r["gpu"] not in gpus or int(r["n_nodes"]) != nodes or r["op"] != "all_reduce":
            continue
        size, p = int(r["size_bytes"]), int(r["n_gpus"])
        if r["time_us"]:
            seconds = float(r["time_us"]) * 1e-6
        elif r["busbw_gbs"]:
            seconds = size * 2 * (p - 1) / p / (float(r["busbw_gbs"]) * 1e9)
        else:
            continue
        out.append(CommTiming("all_reduce", size, p, seconds))
    return out


@dataclass(frozen=True)
class StepRow:
    batch: float
    seconds: float
    group: str


def engine_steps(folder: Path) -> list[StepRow]:
    """Vidur's serving-engine CPU time per step (schedule, prepare inputs, sampler,
    process outputs; medians) by batch size, one group per model."""
    parts = ("schedule", "prepare_inputs_e2e", "sampler_e2e", "process_model_outputs")
    return [
        StepRow(float(r["max_batch_size"]),
                sum(float(r[f"{p}_median_ms"]) for p in parts) * 1e-3, r["model"])
        for r in _rows(folder / "serving_vidur_cpu_overheads_a100.csv")
    ]  # fmt: skip
