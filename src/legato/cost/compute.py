"""Time of compute kernels on one device for one training dtype, from its profile.

The device profile (``legato.devices``, fitted on micro-benchmarks) prices a GEMM by its
shape (``[M, K] x [K, N]``: a rate that small dimensions lower, a kernel latency, never
faster than its bytes over the memory bandwidth), fused attention by its query and key
lengths and heads (the law fitted on attention kernels by sequence length), and streaming
kernels (norms, activations, softmax, dropout,
the optimizer step) by bytes over the bandwidth they achieve.

FP8 training is tile-wise FP8 for the block linears only (``legato.precision``): they run
at the profile's fp8 GEMM law on one-byte operands (``linear_time``), while attention, the
router and the LM head stay in bf16 (``gemm_time``, ``attention_time``). Each operand of
an FP8 GEMM is quantised first by its own memory-bound pass: read in bf16, written in fp8
(3 bytes per element; the forward quantises X and W, the input gradient dY and W^T, the
weight gradient X^T and dY^T, as tile-wise scaling runs along each GEMM's own reduction
axis).
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.calibration import Calibration
from legato.devices.profile import DTYPE_BYTES, DeviceProfile
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
    """One device's profile for one training dtype, and the calibration's kernel overhead."""

    profile: DeviceProfile
    dtype: str  # the dtype GEMMs and attention run in (bf16 when training in fp8)
    linear_dtype: str  # block linears: fp8 in fp8 training, else ``dtype``
    peak_flops: float  # datasheet dense peak of ``dtype``, FLOP/s (for MFU)
    kernel_overhead_s: float = 0.0  # per eager kernel, beyond its bytes and FLOPs

    @classmethod
    def of(cls, device: DeviceSpec, dtype: str, calibration: Calibration) -> DeviceModel:
        if dtype == "fp8":  # a device without fp8 tensor cores: said before any profile
            device.peak_flops("fp8")
        matmul_dtype = {"fp8": "bf16"}.get(dtype, dtype)
        if matmul_dtype == "fp32" and "tf32" in device.peak_tflops:
            matmul_dtype = "tf32"  # fp32 training runs its matmuls on TF32 tensor cores
        return cls(
            profile=calibration.profile_of(device),
            dtype=matmul_dtype,
            linear_dtype="fp8" if dtype == "fp8" else matmul_dtype,
            peak_flops=device.peak_flops(matmul_dtype),
            kernel_overhead_s=calibration.kernel_overhead_s,
        )

    @property
    def launch_s(self) -> float:
        """Host time to issue one kernel (a pass's floor, not added)."""
        return self.profile.launch_overhead

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def gemm_rate(self, m: float, n: float, k: float) -> float:
        """FLOP/s of a GEMM's compute part in the training dtype."""
        return self.profile.gemm_law(self.dtype).rate(m, n, k)

    def gemm_time(self, g: Gemm) -> float:
        """A GEMM in the training dtype (bf16 in fp8 training: attention, router, head)."""
        return self.profile.gemm_time(g.m, g.n, g.k, self.dtype, g.count)

    def linear_time(self, g: Gemm) -> float:
        """A block linear's GEMM (forward, input or weight gradient): fp8 in fp8 training,
        after quantising both operands."""
        gemm = self.profile.gemm_time(g.m, g.n, g.k, self.linear_dtype, g.count)
        if self.linear_dtype != "fp8" or g.count <= 0:
            return gemm
        return gemm + self.memory_time(QUANTISE_BYTES * (g.m * g.k + g.k * g.n) * g.count)

    def attention_time(
        self, batch: float, q_len: float, kv_len: float, heads: float, kv_heads: float,
        head_dim: float, *, causal: bool, backward: bool = False,
    ) -> float:  # fmt: skip
        """One fused attention kernel in the training dtype, by its shape: the profile's
        law, whose efficiency falls with short query blocks and short keys (see
        ``DeviceProfile.attention_time``)."""
        return self.profile.attention_time(batch, q_len, kv_len, heads, kv_heads, head_dim,
                                           causal=causal, dtype=self.dtype, backward=backward)  # fmt: skip

    def memory_time(self, nbytes: float) -> float:
        return self.profile.memory_time(nbytes)

    def kernels_time(self, kernels: float) -> float:
        """What ``kernels`` eager kernels cost beyond their work (dispatch, fork/join)."""
        return kernels * self.kernel_overhead_s

    def launch_floor(self, kernels: float) -> float:
        """The least time a pass of ``kernels`` kernels takes: the host issues them one by
        one, so once kernels run shorter than their issue time (small GEMMs, high tp), the
        issue rate sets the pace, whatever the work."""
        return kernels * self.launch_s
