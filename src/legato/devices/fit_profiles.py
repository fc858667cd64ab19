"""Build every preset's profile from the micro-benchmark folder (``../shared/calibration/
micro/``; ``benchmarks/fit_device_profiles.py`` runs this and writes the files).

Per device: the laws its own rows fit; a law with no rows of its own is either the same
silicon's (``TRANSFERS``: H100, H200 and H800 share the GH100 SMs and clocks, the A100s the
GA100's; the evidence says so and the law stays marked unfitted) or the datasheet prior.
End-to-end runs are not read here.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from legato.devices import micro
from legato.devices.fit_laws import (
    attention_law,
    backward_ratio,
    fit_steps,
    gemm_law,
    level_law,
    relative_errors,
)
from legato.devices.laws import Fit, HostLaw, HostLinkLaw, MemoryLaw
from legato.devices.link_fit import CommTiming
from legato.devices.nccl_tests import read_nccl_tests
from legato.devices.priors import prior_profile
from legato.devices.profile import DeviceProfile
from legato.specs.registry import list_devices, load_device

VIDUR = "Vidur @7d47513 (MIT)"
AZURE = "Azure AI-benchmarking-guide @8fd0c6e (MIT)"
MLENG = "ml-engineering @744d01e (CC BY-SA 4.0)"
CUDNN = "cudnn-frontend (MIT-style NVIDIA)"
# Where each device's own rows are, by the label each file gives the GPU.
GPUS = {
    "a100-80g": {
        "vidur_gemm": "A100-80GB", "published_gemm": ("A100-SXM4-80GB", "A100 SXM"),
        "babelstream": "A100-SXM4-80GB", "stream": "A100-80GB",
        "paged": "NVIDIA A100 80GB PCIe", "host": ("A100-SXM4-80GB",),
        "vidur_system": "a100_dgx",
        "nccl_tests": ("A100 (8-GPU NVLink3 node; SKU not stated)", "A100-SXM4-80GB"),
        "steps": True,
    },
    "a100-40g": {"stream": "A100-40GB"},
    "h100": {
        "vidur_gemm": "H100-80GB", "published_gemm": ("H100 80GB HBM3 (SXM)", "H100 SXM"),
        "babelstream": "H100 80GB HBM3 (SXM)", "host": ("H100 80GB HBM3 (SXM)",),
        "vidur_system": "h100_dgx", "nccl_tests": ("H100 80GB HBM3 (SXM)",),
        "nccl_tests_inter": ("H100 80GB HBM3",),
    },
    "h200": {
        "published_gemm": ("H200", "H200 SXM"), "babelstream": "H200", "stream": "H200",
        "paged": "NVIDIA H200", "training_attention": "NVIDIA H200",
        "host": ("H200", "H200 SXM"), "nccl_tests": ("H200", "H200 SXM"),
    },
    "h800": {"published_gemm": ("H800 SXM5",)},
}  # fmt: skip
TRANSFERS = {"a100-40g": "a100-80g", "h100": "h200", "h200": "h100", "h800": "h100"}
# Inter-node bandwidth a 2 x 8 ring reaches, GB/s per direction: GCP A3 Mega has 8 x 200
# Gb/s GPUDirect-TCPXO NICs per node (the sweep's repository name says A3 Mega), 25 GB/s per
# GPU, and a ring through the 8 GPUs of a node uses all 8 NICs (``cost.mesh``): 8 x 25.
INTER_NODE_GBPS = {"h100": 200.0}
# Why the inter-node level keeps the intra-node call latency: a call's launch and kernel
# start happen on the node, and NCCL's own network latencies (``collectives``) price the
# hops of an InfiniBand/RoCE fabric; A3 Mega's 8-byte all-reduce takes ~125 us, the
# software path of GPUDirect-TCPXO (TCP), which an RDMA fabric does not pay.
INTER_CALL_WHY = "A3 Mega's ~125 us small all-reduce is TCPXO's TCP path, not RDMA's"


def _gemm(folder: Path, device: str, memory_gbs: float) -> dict:
    where = GPUS.get(device, {})
    rows = micro.vidur_gemm(folder, where["vidur_gemm"]) if "vidur_gemm" in where else []
    rows += micro.published_gemm(folder, where.get("published_gemm", ()))
    laws = {}
    half = [r for r in rows if r.dtype in ("fp16", "bf16")]
    if half:
        law = gemm_law(half, memory_gbs, f"{len(half)} fp16/bf16 GEMM rows: "
                       f"gemm_vidur_llama_linear_layers.csv ({VIDUR}), gemm_published_tables.csv")  # fmt: skip
        laws["fp16"] = law
        laws["bf16"] = dataclasses.replace(law, fit=dataclasses.replace(
            law.fit, evidence=law.fit.evidence + "; bf16 runs at the fp16 tensor-core rate (datasheet)"))  # fmt: skip
    fp8 = [r for r in rows if r.dtype == "fp8"]
    if len(fp8) >= 4:
        libraries = ", ".join(dict.fromkeys(r.group for r in fp8))
        laws["fp8"] = gemm_law(fp8, memory_gbs, f"{len(fp8)} fp8 GEMM rows of "
                               f"gemm_published_tables.csv ({libraries})")  # fmt: skip
    return laws


def _attention(folder: Path, device: str) -> dict:
    where = GPUS.get(device, {})
    rows = micro.paged_attention(folder, where["paged"]) if "paged" in where else []
    training = micro.training_attention(folder, where.get("training_attention", "-"))
    laws = {}
    for dtype in ("bf16", "fp8"):
        forward = [r for r in rows + training if r.dtype == dtype and not r.backward]
        if len(forward) < 6:
            continue
        mine = [r for r in training if r.dtype == dtype]
        ratio = backward_ratio(mine) if any(r.backward for r in mine) else None
        label = where["paged"] if rows else where["training_attention"]
        evidence = (f"{len(forward)} forward rows ({label}): attention_serving_cudnn_paged_gqa.csv, "
                    f"attention_sdpa_flash_published.csv ({CUDNN})")  # fmt: skip
        laws[dtype] = attention_law(forward, ratio or 2.5, evidence + (
            "" if ratio else "; backward_ratio: prior 2.5 (5 matmuls to 2)"))  # fmt: skip
    if "bf16" in laws:  # the same kernels run fp16 at the same tensor-core rate
        law = laws["bf16"]
        laws["fp16"] = dataclasses.replace(law, fit=dataclasses.replace(
            law.fit, evidence=law.fit.evidence + "; fp16 runs at the bf16 rate (datasheet)"))  # fmt: skip
    return laws


def _memory(folder: Path, device: str) -> MemoryLaw | None:
    """BabelStream's median kernel (copy, mul, add, triad); else gpu-stream's best scan;
    scored on the other file of the same GPU."""
    where = GPUS.get(device, {})
    babel = micro.babelstream(folder, where.get("babelstream", "-"))
    stream = micro.stream_best(folder, where.get("stream", "-"))
    kernels = ("copy", "mul", "add", "triad") if babel else ("read", "scale", "triad")
    own, other = (babel, stream) if babel else (stream, {})
    if not own:
        return None
    bandwidth = statistics.median(own[k] for k in kernels if k in own)
    source = "memory_hbm_babelstream_azure.csv" if babel else "memory_gpu_stream_vs_occupancy.csv"
    fit = Fit(True, f"median of {', '.join(kernels)} in {source}")
    if other:
        med, mean = relative_errors([bandwidth] * 3, [other[k] for k in ("read", "scale", "triad")])
        fit = dataclasses.replace(
            fit, held_out_median_pct=round(med, 2), held_out_mean_pct=round(mean, 2)
        )
    return MemoryLaw(round(bandwidth, 1), fit)


def _host_link(folder: Path, device: str) -> HostLinkLaw | None:
    copies = micro.host_copies(folder, GPUS.get(device, {}).get("host", ()))
    if not copies["h2d"]:
        return None
    h2d = statistics.median(copies["h2d"])
    d2h = statistics.median(copies["d2h"]) if copies["d2h"] else h2d
    note = ""
    if d2h < h2d / 2:  # Azure's A100 VM: D2H 6.27 GB/s as published, README: treat with care
        d2h, note = h2d, "; the published D2H (a quarter of H2D) is treated as an outlier"
    return HostLinkLaw(h2d, d2h, Fit(True, f"nvbandwidth in p2p_host_device_bandwidth.csv{note}"))


def _collectives(folder: Path, device: str, nominal: float, extra: list[CommTiming]) -> dict:
    where = GPUS.get(device, {})
    laws = {}
    intra = list(extra)
    if "vidur_system" in where:
        intra += micro.vidur_collectives(folder, where["vidur_system"], 1)
    intra += micro.nccl_tests_published(folder, where.get("nccl_tests", ()), 1)
    if len({t.nbytes for t in intra}) >= 4:
        laws["intra_node"] = level_law(intra, nominal, False, f"{len(intra)} intra-node "
            f"timings: collectives_vidur_torch_nccl.csv ({VIDUR}), collectives_nccl_tests_"
            f"published.csv ({AZURE}; {MLENG}) against the {nominal:g} GB/s link")  # fmt: skip
    inter = micro.nccl_tests_published(folder, where.get("nccl_tests_inter", ()), 2)
    if inter and device in INTER_NODE_GBPS and "intra_node" in laws:
        gbps, call = INTER_NODE_GBPS[device], laws["intra_node"].call_latency_us
        laws["inter_node"] = level_law(inter, gbps, True, f"{len(inter)} 2-node nccl-tests "
            f"all-reduce timings (GCP A3 Mega, {gbps:g} GB/s per 8-GPU ring) in "
            "collectives_nccl_tests_published.csv: the bus share; the call latency is the "
            f"intra-node fit's ({call:g} us: {INTER_CALL_WHY})", call)  # fmt: skip
    return laws


def _host(folder: Path, device: str, prior: HostLaw) -> HostLaw:
    rows = micro.engine_steps(folder) if GPUS.get(device, {}).get("steps") else []
    if len({r.batch for r in rows}) < 2:
        return prior
    base, per, report = fit_steps(rows)
    fit = Fit(True, f"serving_vidur_cpu_overheads_a100.csv ({VIDUR}): schedule + prepare "
              "inputs + sampler + process outputs, medians, by batch",
              *(round(x, 2) for x in report or ()))  # fmt: skip
    return dataclasses.replace(prior, step_base_ms=base, step_per_sequence_ms=per, step_fit=fit)


def fit_own(folder: Path, device: str, nccl_logs: list[CommTiming]) -> DeviceProfile:
    """``device``'s profile from its own rows; priors where it has none."""
    spec = load_device(device)
    base = prior_profile(spec)
    memory = _memory(folder, device) or base.memory
    levels = {**base.collectives,
              **_collectives(folder, device, spec.link.bandwidth_gbps, nccl_logs)}  # fmt: skip
    return dataclasses.replace(
        base,
        description=spec.description,
        gemm={**base.gemm, **_gemm(folder, device, memory.bandwidth_gbs)},
        attention={**base.attention, **_attention(folder, device)},
        memory=memory,
        host_link=_host_link(folder, device) or base.host_link,
        host=_host(folder, device, base.host),
        collectives=levels,
    )


def _transfer(law, source: str):
    """``law`` of ``source`` for a device of the same silicon: kept unfitted, saying so."""
    fit = dataclasses.replace(law.fit, fitted=False, evidence=f"transferred from {source} "
                              f"(same SMs and clocks): {law.fit.evidence}")  # fmt: skip
    return dataclasses.replace(law, fit=fit)


def with_transfers(profile: DeviceProfile, source: DeviceProfile) -> DeviceProfile:
    """Compute laws ``profile`` keeps as priors taken from ``source`` (same silicon); the
    attention law reads the KV cache at this device's own memory bandwidth."""
    gemm = dict(profile.gemm)
    for dtype, law in source.gemm.items():
        if law.fit.fitted and not gemm.get(dtype, law).fit.fitted:
            gemm[dtype] = _transfer(law, source.device)
    attention = dict(profile.attention)
    for dtype, law in source.attention.items():
        if law.fit.fitted and not attention.get(dtype, law).fit.fitted:
            scaled = (
                law.kv_bandwidth_gbs * profile.memory.bandwidth_gbs / source.memory.bandwidth_gbs
            )
            attention[dtype] = dataclasses.replace(_transfer(law, source.device),
                                                   kv_bandwidth_gbs=round(scaled, 1))  # fmt: skip
    return dataclasses.replace(profile, gemm=gemm, attention=attention)


def fit_all(folder: Path, nccl_logs: dict[str, list[CommTiming]]) -> dict[str, DeviceProfile]:
    """Every device preset's profile (``nccl_logs``: extra nccl-tests timings by device)."""
    own = {d: fit_own(folder, d, nccl_logs.get(d, [])) for d in list_devices()}
    return {d: with_transfers(p, own[TRANSFERS[d]]) if d in TRANSFERS else p
            for d, p in own.items()}  # fmt: skip


def vtrain_logs(folder: Path) -> list[CommTiming]:
    """vTrain's A100 nccl-tests all-reduce logs (``a100_nccl_allreduce_{2,4,8}gpu.txt``,
    times in ns) in ``folder``, when there."""
    paths = [(folder / f"a100_nccl_allreduce_{p}gpu.txt", p) for p in (2, 4, 8)]
    return [t for path, p in paths if path.is_file() for t in read_nccl_tests(path, p)]
