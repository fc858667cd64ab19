"""The profile of a device no micro-benchmark has measured: datasheet figures scaled by
public rules of thumb, every law marked unfitted. Each rule below names its public
source; none is fitted on anything."""

from __future__ import annotations

from legato.devices.collectives import LEVELS, LevelLaw
from legato.devices.laws import AttentionLaw, Fit, GemmLaw, HostLaw, HostLinkLaw, MemoryLaw
from legato.devices.profile import DeviceProfile
from legato.specs.device import DeviceSpec

# cuBLAS reaches 85-90% of the datasheet peak on large isolated GEMMs, less under the
# sustained clocks of training (NVIDIA's cuBLAS performance pages; MAMF tables)
GEMM_FRACTION = 0.75
# a 32-wide dimension fills a quarter of a 128-wide tile: about half the rate
HALF_DIM = 32.0
KERNEL_LATENCY_US = 5.0  # a CUDA kernel's launch-to-finish floor is a few microseconds
# FlashAttention-2 forward: 50-73% of the A100 peak (Dao, 2023)
ATTENTION_FRACTION = 0.55
BACKWARD_RATIO = 2.5  # the backward runs 5 matmuls to the forward's 2
MEMORY_FRACTION = 0.80  # STREAM-like kernels reach 80-90% of the datasheet bandwidth
HOST_LINK_GBS = 25.0  # PCIe 4.0 x16, the common host link (32 GB/s raw, ~25 achieved)
BUS_FRACTION = 0.80  # nccl-tests bus bandwidth is typically ~80% of the link's nominal
CALL_LATENCY_US = 10.0  # a torch.distributed call's launch and kernel start
# Host time to issue one eager training kernel, the sum of published per-op figures:
# Python, dispatcher and autograd recording ~7 us per op with requires_grad
# (pytorch/pytorch#41383: 1M `2*x` in 6.8 s; #122029: eager 5.6 us), the CUDA launch
# ~5 us (cudaLaunchKernel, plus cuBLAS's occupancy query before a GEMM: NVIDIA's "Getting
# Started with CUDA Graphs" and Hugging Face's torch.profiler guide), and ~3 us of the
# kernel-less ops around it (aten::t/view/reshape per linear: ~2 us each, #41383).
LAUNCH_US = 15.0
LAUNCH_EVIDENCE = ("PyTorch eager per-op host time: dispatch + autograd ~7 us (pytorch/pytorch"
                   "#41383, #122029) + CUDA launch ~5 us (NVIDIA CUDA Graphs blog) + ~3 us "
                   "of kernel-less view/transpose ops (#41383); no micro data measures it")  # fmt: skip


def _figure(x: float) -> float:
    """``x`` to 6 significant figures (a CPU's TFLOP/s must not round to zero)."""
    return float(f"{x:.6g}")


def prior(what: str) -> Fit:
    return Fit(fitted=False, evidence=f"prior: {what}")


def prior_profile(device: DeviceSpec) -> DeviceProfile:
    """Every law from ``device``'s datasheet figures and the rules above."""
    gemm = {
        dtype: GemmLaw(_figure(tflops * GEMM_FRACTION), HALF_DIM, KERNEL_LATENCY_US,
                       prior(f"{GEMM_FRACTION} of the datasheet {dtype} peak, half_dim {HALF_DIM:g}"))
        for dtype, tflops in device.peak_tflops.items()
    }  # fmt: skip
    memory = _figure(device.memory_bandwidth_gbps * MEMORY_FRACTION)
    attention = {
        dtype: AttentionLaw(_figure(tflops * ATTENTION_FRACTION), 0.0, 0.0, memory, KERNEL_LATENCY_US,
                            BACKWARD_RATIO,
                            prior(f"{ATTENTION_FRACTION} of the datasheet {dtype} peak"))
        for dtype, tflops in device.peak_tflops.items() if dtype != "fp32"
    }  # fmt: skip
    level = LevelLaw(BUS_FRACTION, CALL_LATENCY_US,
                     fit=prior(f"bus bandwidth {BUS_FRACTION} of the link's nominal"))  # fmt: skip
    return DeviceProfile(
        device=device.name,
        description=f"{device.description or device.name}: datasheet priors only",
        gemm=gemm,
        attention=attention,
        memory=MemoryLaw(memory, prior(f"{MEMORY_FRACTION} of the datasheet bandwidth")),
        host_link=HostLinkLaw(HOST_LINK_GBS, HOST_LINK_GBS, prior("PCIe 4.0 x16")),
        host=HostLaw(LAUNCH_US, 0.0, 0.0, prior(LAUNCH_EVIDENCE), prior("none")),
        collectives=dict.fromkeys(LEVELS, level),
    )
