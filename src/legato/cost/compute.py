"""Time of compute kernels on one device: GEMMs by shape, fused attention, memory-bound ops.

A GEMM ``[M, K] x [K, N]`` runs at ``peak * f / (1 + d0/M + d0/N + d0/K)``: large GEMMs
reach the fraction ``f`` of the datasheet peak that cuBLAS reaches, and each small
dimension costs efficiency smoothly (tiles are partly empty, too few tiles fill the
device, short K loops do not amortise the epilogue). It can never beat its roofline: the
bytes of A, B and C over the memory bandwidth. Elementwise kernels (norms, activations,
softmax, dropout, the optimizer step) are memory-bound: bytes over bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.calibration import Calibration
from legato.specs.device import DeviceSpec


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

    peak_flops: float  # datasheet dense peak, FLOP/s
    gemm_fraction: float
    half_dim: float
    attention_fraction: float
    memory_bandwidth: float  # achievable bytes/s
    dtype_bytes: int

    @classmethod
    def of(cls, device: DeviceSpec, dtype: str, calibration: Calibration) -> DeviceModel:
        matmul_dtype = "fp16" if dtype == "fp16" else dtype
        if matmul_dtype == "fp32" and "tf32" in device.peak_tflops:
            matmul_dtype = "tf32"  # fp32 training runs its matmuls on TF32 tensor cores
        return cls(
            peak_flops=device.peak_flops(matmul_dtype),
            gemm_fraction=calibration.gemm_peak_fraction(device.name),
            half_dim=calibration.gemm_half_dim,
            attention_fraction=calibration.attention_fraction,
            memory_bandwidth=device.memory_bandwidth_gbps * 1e9 * calibration.memory_bw_fraction,
            dtype_bytes={"fp32": 4, "fp8": 1}.get(dtype, 2),
        )

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        d0 = self.half_dim
        return self.gemm_fraction / (1.0 + d0 / m + d0 / n + d0 / k)

    def gemm_time(self, g: Gemm) -> float:
        if g.m <= 0 or g.n <= 0 or g.k <= 0 or g.count <= 0:
            return 0.0
        compute = g.flops / (self.peak_flops * self.gemm_efficiency(g.m, g.n, g.k))
        nbytes = self.dtype_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count
        return max(compute, self.memory_time(nbytes))

    def attention_time(self, flops: float) -> float:
        """Fused attention kernel for ``flops`` of QK^T and AV."""
        return flops / (self.peak_flops * self.gemm_fraction * self.attention_fraction)

    def memory_time(self, nbytes: float) -> float:
        return nbytes / self.memory_bandwidth
