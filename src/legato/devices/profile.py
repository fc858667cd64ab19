"""DeviceProfile: how long one device takes for each kind of work, from its laws.

The one interface every simulator prices work with: the training cost model
(``cost.compute.DeviceModel``, ``cost.collectives``), the serving simulator (engine steps:
prefill and decode GEMMs, paged attention, the engine's CPU work, KV and adapter swaps) and
the cluster simulator. A profile is data (``devices/profiles/<device>.toml``, see
``profile_file``): constants fitted on micro-benchmarks, each law marked fitted or a
datasheet prior, with its evidence. Nothing here is fitted on end-to-end runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from legato.devices.collectives import LEVELS, LevelLaw
from legato.devices.laws import AttentionLaw, Fit, GemmLaw, HostLaw, HostLinkLaw, MemoryLaw
from legato.errors import SpecError

# bytes per element of a GEMM or attention operand in each dtype
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class DeviceProfile:
    """Laws of one device (``device``: its preset name). ``gemm`` and ``attention`` by
    dtype; ``collectives`` by link level (``intra_node``, ``supernode``, ``inter_node``)."""

    device: str
    gemm: dict[str, GemmLaw]
    attention: dict[str, AttentionLaw]
    memory: MemoryLaw
    host_link: HostLinkLaw
    host: HostLaw
    collectives: dict[str, LevelLaw]
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        missing = [level for level in LEVELS if level not in self.collectives]
        if missing:
            raise SpecError(f"profile {self.device}: collectives.{missing[0]} is missing")

    def __hash__(self) -> int:  # dict fields; the device name and its laws' figures
        return hash((self.device, self.memory, self.host))

    @property
    def memory_bandwidth(self) -> float:
        """Bytes/s streaming kernels achieve."""
        return self.memory.bandwidth_gbs * 1e9

    @property
    def launch_overhead(self) -> float:
        """Host seconds to issue one eager kernel."""
        return self.host.launch_us * 1e-6

    def gemm_law(self, dtype: str) -> GemmLaw:
        if dtype not in self.gemm:
            raise SpecError(
                f"profile {self.device} has no {dtype} GEMM law; it has {', '.join(self.gemm)}"
            )
        return self.gemm[dtype]

    def gemm_time(self, m: float, n: float, k: float, dtype: str, count: float = 1.0) -> float:
        """Seconds for ``count`` ``[m, k] x [k, n]`` products in ``dtype`` (one batched
        kernel), no faster than moving A, B and C through memory."""
        nbytes = DTYPE_BYTES[dtype] * (m * k + k * n + m * n) * count
        return self.gemm_law(dtype).time(m, n, k, count, nbytes, self.memory_bandwidth)

    def attention_time(
        self,
        batch: float,
        q_len: float,
        kv_len: float,
        heads: float,
        kv_heads: float,
        head_dim: float,
        *,
        causal: bool = True,
        dtype: str = "bf16",
        backward: bool = False,
    ) -> float:
        """Seconds of one fused attention kernel: ``batch`` sequences of ``q_len`` new
        tokens against ``kv_len`` keys (``q_len == kv_len``: training or a whole prefill;
        ``q_len`` 1: decode), ``heads`` query and ``kv_heads`` key/value heads of
        ``head_dim``; causal masks the keys after each query (bottom-right aligned)."""
        law = self.attention_law(dtype)
        if min(batch, q_len, kv_len, heads) <= 0:
            return 0.0
        pairs = q_len * kv_len - (q_len * (q_len - 1) / 2 if causal else 0.0)
        flops = 4.0 * batch * heads * pairs * head_dim
        compute = flops / (law.rate_tflops * 1e12 * law.efficiency(q_len, kv_len))
        if backward:
            return law.latency_us * 1e-6 + law.backward_ratio * compute
        nbytes = DTYPE_BYTES[dtype] * batch * head_dim * (2 * kv_len * kv_heads + 2 * q_len * heads)
        return law.latency_us * 1e-6 + max(compute, nbytes / (law.kv_bandwidth_gbs * 1e9))

    def attention_law(self, dtype: str) -> AttentionLaw:
        law = self.attention.get(dtype) or self.attention.get("bf16")
        if law is None:
            raise SpecError(f"profile {self.device} has no attention law for {dtype}")
        return law

    def memory_time(self, nbytes: float) -> float:
        """Seconds for streaming kernels moving ``nbytes`` (reads plus writes)."""
        return self.memory.time(nbytes)

    def host_link_time(self, nbytes: float, to_device: bool = True) -> float:
        """Seconds to copy ``nbytes`` between host memory and this device."""
        return self.host_link.time(nbytes, to_device)

    def step_overhead(self, batch: float) -> float:
        """Seconds of a serving engine's CPU work for one step of ``batch`` sequences."""
        return (self.host.step_base_ms + self.host.step_per_sequence_ms * batch) * 1e-3

    def collective_time(
        self,
        op: str,
        nbytes: float,
        ranks: int,
        bandwidth_gbps: float,
        latency_us: float = 0.0,
        level: str = "intra_node",
    ) -> float:
        """Seconds for one ``op`` of ``nbytes`` (see ``devices.collectives``) over
        ``ranks`` devices whose slowest link is ``level`` with ``bandwidth_gbps`` per device
        (``latency_us`` per step: the alpha-beta law's); zero when nothing is sent."""
        if nbytes <= 0 or (ranks <= 1 and op != "p2p"):
            return 0.0
        if level not in self.collectives:
            raise SpecError(f"unknown link level {level!r}; known: {', '.join(LEVELS)}")
        law = self.collectives[level]
        network = level != "intra_node"
        return law.time(op, nbytes, ranks, bandwidth_gbps, latency_us, network)

    def fits(self) -> list[tuple[str, Fit]]:
        """Every law's name and where its constants come from."""
        parts = [(f"gemm.{d}", law.fit) for d, law in self.gemm.items()]
        parts += [(f"attention.{d}", law.fit) for d, law in self.attention.items()]
        parts += [("memory", self.memory.fit), ("host_link", self.host_link.fit)]
        parts += [("host.launch", self.host.fit), ("host.step", self.host.step_fit)]
        parts += [(f"collectives.{lv}", law.fit) for lv, law in self.collectives.items()]
        return parts

    def unfitted(self) -> list[str]:
        """The laws that keep datasheet priors or were transferred from the same silicon
        (not fitted on this device's micro-benchmarks)."""
        return [name for name, fit in self.fits() if not fit.fitted]
