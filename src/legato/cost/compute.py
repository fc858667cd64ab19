"""Time of compute kernels on one device: GEMMs by shape, fused attention, memory-bound ops.

A GEMM ``[M, K] x [K, N]`` runs at ``peak * f / (1 + d0/M + d0/N + d0/K)``: large GEMMs
reach the fraction ``f`` of the datasheet peak that cuBLAS reaches, and each small
dimension costs efficiency smoothly (tiles are partly empty, too few tiles fill the
device, short K loops do not amortise the epilogue). It can never beat its roofline: the
bytes of A, B and C over the memory bandwidth. Elementwise kernels (norms, activations,
softmax, dropout, the optimizer step) are memory-bound: bytes over bandwidth.

FP8 training is tile-wise FP8 for the block linears only (``legato.precision``): they run
at the device's fp8 peak on one-byte operands (``linear_time``), while attention, the
router and the LM head stay in bf16 (``gemm_time``, ``attention_time``). An FP8 GEMM keeps
only ``fp8_gemm_share`` of the bf16 GEMM's efficiency (per-tile scaling, the FP32
promotion of partial sums), and each of its two operands is quantised first by its own
memory-bound pass: read in bf16, written in fp8 (3 bytes per element; the forward
quantises X and W, the input gradient dY and W^T, the weight gradient X^T and dY^T, as
tile-wise scaling runs along each GEMM's own reduction axis).
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.calibration import Calibration
from legato.specs.device import DeviceSpec

QUANTISE_BYTES = 3  # per element: read bf16, write fp8 (the per-tile scales are ~1% more)


@dataclass(frozen=True)
class Gemm:
    """``count`` independent GEMMs of ``[m, k] x [k, n]`` (a batched GEMM when > 1)."""

    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    def backward(self) -> tuple[Gemm, Gemm]:
        """(input gradient dX = dY W^T, weight gradient dW = X^T dY)."""
        return Gemm(self.m, self.k, self.n, self.count), Gemm(self.k, self.n, self.m, self.count)


@dataclass(frozen=True)
class DeviceModel:
    """Peak rates of one device for one training dtype, after calibration."""

    peak_flops: float  # datasheet dense peak, FLOP/s (bf16 when training in fp8)
    gemm_fraction: float
    half_dim: float
    attention_fraction: float
    memory_bandwidth: float  # achievable bytes/s
    dtype_bytes: int
    linear_peak_flops: float  # block linears: the fp8 peak in fp8 training, else peak_flops
    linear_bytes: int  # bytes per block-linear operand element (1 in fp8 training)
    linear_share: float = 1.0  # of the GEMM efficiency block linears keep (fp8_gemm_share)
    kernel_overhead_s: float = 0.0  # per eager kernel, beyond its bytes and FLOPs
    launch_s: float = 0.0  # host time to issue one kernel (a pass's floor, not added)

    @classmethod
    def of(cls, device: DeviceSpec, dtype: str, calibration: Calibration) -> DeviceModel:
        matmul_dtype = {"fp16": "fp16", "fp8": "bf16"}.get(dtype, dtype)
        if matmul_dtype == "fp32" and "tf32" in device.peak_tflops:
            matmul_dtype = "tf32"  # fp32 training runs its matmuls on TF32 tensor cores
        peak = device.peak_flops(matmul_dtype)
        fp8 = dtype == "fp8"
        return cls(
            peak_flops=peak,
            gemm_fraction=calibration.gemm_peak_fraction(device.name),
            half_dim=calibration.gemm_half_dim,
            attention_fraction=calibration.attention_fraction,
            memory_bandwidth=device.memory_bandwidth_gbps * 1e9 * calibration.memory_bw_fraction,
            dtype_bytes=4 if dtype == "fp32" else 2,
            linear_peak_flops=device.peak_flops("fp8") if fp8 else peak,
            linear_bytes=1 if fp8 else (4 if dtype == "fp32" else 2),
            linear_share=calibration.fp8_gemm_share if fp8 else 1.0,
            kernel_overhead_s=calibration.kernel_overhead_s,
            launch_s=calibration.launch_s,
        )

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        d0 = self.half_dim
        return self.gemm_fraction / (1.0 + d0 / m + d0 / n + d0 / k)

    def gemm_time(self, g: Gemm) -> float:
        """A GEMM in the training dtype (bf16 in fp8 training: attention, router, head)."""
        return self._time(g, self.peak_flops, self.dtype_bytes)

    def linear_time(self, g: Gemm) -> float:
        """A block linear's GEMM (forward, input or weight gradient): fp8 in fp8 training,
        after quantising both operands."""
        gemm = self._time(g, self.linear_peak_flops, self.linear_bytes, self.linear_share)
        if self.linear_bytes != 1 or g.count <= 0:
            return gemm
        return gemm + self.memory_time(QUANTISE_BYTES * (g.m * g.k + g.k * g.n) * g.count)

    def _time(self, g: Gemm, peak: float, element_bytes: int, share: float = 1.0) -> float:
        if g.m <= 0 or g.n <= 0 or g.k <= 0 or g.count <= 0:
            return 0.0
        compute = g.flops / (peak * share * self.gemm_efficiency(g.m, g.n, g.k))
        nbytes = element_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count
        return max(compute, self.memory_time(nbytes))

    def attention_time(self, flops: float) -> float:
        """Fused attention kernel for ``flops`` of QK^T and AV."""
        return flops / (self.peak_flops * self.gemm_fraction * self.attention_fraction)

    def memory_time(self, nbytes: float) -> float:
        return nbytes / self.memory_bandwidth

    def kernels_time(self, kernels: float) -> float:
        """What ``kernels`` eager kernels cost beyond their work (dispatch, fork/join)."""
        return kernels * self.kernel_overhead_s

    def launch_floor(self, kernels: float) -> float:
        """The least time a pass of ``kernels`` kernels takes: the host issues them one by
        one, so once kernels run shorter than their issue time (small GEMMs, high tp), the
        issue rate sets the pace, whatever the work."""
        return kernels * self.launch_s
