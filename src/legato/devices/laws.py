"""The laws a device profile prices work with, one per kind of work, each with its evidence.

A law is a small mechanism with a few constants: GEMMs by shape, fused attention by
query and key lengths, streaming kernels by bytes, host<->device copies by bytes, the
serving engine's CPU work per step. Each law says whether its constants were fitted on
micro-benchmarks (``fitted``) and where they come from (``evidence``: the file and rows,
or the datasheet prior); ``held_out_*`` is the fit's error on micro-benchmark rows the fit
did not see (``None`` for a prior). Collectives are ``legato.devices.collectives``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fit:
    """Where a law's constants come from, and how well they predict unseen rows."""

    fitted: bool = False
    evidence: str = ""
    held_out_median_pct: float | None = None
    held_out_mean_pct: float | None = None


@dataclass(frozen=True)
class GemmLaw:
    """A ``[m, k] x [k, n]`` product: ``latency + max(flops / rate(m, n, k), bytes /
    memory bandwidth)`` with ``rate = rate_tflops / (1 + half_dim (1/m + 1/n + 1/k))``.

    ``half_dim`` is where a small dimension halves the rate: partly empty tiles, too few
    tiles to fill the SMs (wave quantisation, averaged over the tile shapes cuBLAS
    chooses), short K loops that do not amortise the epilogue. An explicit wave model with
    one tile shape predicted held-out shapes worse (docs/cost_model.md)."""

    rate_tflops: float
    half_dim: float
    latency_us: float
    fit: Fit = field(default_factory=Fit)

    def rate(self, m: float, n: float, k: float) -> float:
        """FLOP/s of the compute part."""
        return self.rate_tflops * 1e12 / (1.0 + self.half_dim * (1 / m + 1 / n + 1 / k))

    def time(self, m: float, n: float, k: float, count: float, nbytes: float, bandwidth: float):
        """Seconds for ``count`` products (one batched kernel) moving ``nbytes``."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        compute = 2.0 * m * n * k * count / self.rate(m, n, k)
        return self.latency_us * 1e-6 + max(compute, nbytes / bandwidth)


@dataclass(frozen=True)
class AttentionLaw:
    """A fused attention kernel (FlashAttention/cuDNN): ``latency + max(flops / (rate
    e), bytes / kv_bandwidth)`` with ``e = 1 / (1 + q_half/q + kv_half/kv)`` (short query
    blocks leave tiles empty, short keys do not amortise the softmax rescaling) and the
    bytes of Q, K, V and O. Decode (a few query tokens) is bound by reading the KV cache;
    prefill by the matmuls. The backward takes ``backward_ratio`` times the forward's
    compute (5 matmuls instead of 2, and the recomputed scores)."""

    rate_tflops: float
    q_half: float
    kv_half: float
    kv_bandwidth_gbs: float
    latency_us: float
    backward_ratio: float
    fit: Fit = field(default_factory=Fit)

    def efficiency(self, q: float, kv: float) -> float:
        return 1.0 / (1.0 + self.q_half / q + self.kv_half / kv)


@dataclass(frozen=True)
class MemoryLaw:
    """Streaming kernels (norms, activations, copies, the optimizer): bytes over the
    bandwidth they achieve (STREAM-like kernels, not the datasheet figure)."""

    bandwidth_gbs: float
    fit: Fit = field(default_factory=Fit)

    def time(self, nbytes: float) -> float:
        return nbytes / (self.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class HostLinkLaw:
    """Copies between host memory and the device (PCIe, C2C): bytes over the measured
    rate in each direction (adapter and KV swaps, activation offload)."""

    host_to_device_gbs: float
    device_to_host_gbs: float
    fit: Fit = field(default_factory=Fit)

    def time(self, nbytes: float, to_device: bool = True) -> float:
        rate = self.host_to_device_gbs if to_device else self.device_to_host_gbs
        return nbytes / (rate * 1e9)


@dataclass(frozen=True)
class HostLaw:
    """Host time: ``launch_us`` to issue one eager kernel (Python, dispatcher, autograd,
    the launch; a pass takes at least its kernels times this), and a serving engine's CPU
    work per step (schedule, prepare inputs, sample, process outputs):
    ``step_base_ms + step_per_sequence_ms x batch``."""

    launch_us: float
    step_base_ms: float
    step_per_sequence_ms: float
    fit: Fit = field(default_factory=Fit)
    step_fit: Fit = field(default_factory=Fit)
