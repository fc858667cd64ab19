"""DeviceSpec: one accelerator's peak compute, memory and its default link to its peers.

Figures are the vendor's datasheet numbers for dense math (no structured sparsity); the
cost model scales them by a measured efficiency. Bandwidths are GB/s (1e9 bytes/s), link
bandwidth per device in one direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from legato.errors import SpecError

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
DTYPES: tuple[str, ...] = get_args(Dtype)


@dataclass(frozen=True)
class Link:
    """A point-to-point link: bandwidth per device in one direction, and per-message
    latency (the alpha and 1/beta of the alpha-beta collective model)."""

    name: str
    bandwidth_gbps: float
    latency_us: float

    def __post_init__(self) -> None:
        if self.bandwidth_gbps <= 0:
            raise SpecError(f"{self.name}: bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        if self.latency_us < 0:
            raise SpecError(f"{self.name}: latency_us must be >= 0, got {self.latency_us}")


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator. ``peak_tflops`` maps a dtype (fp32/tf32/bf16/fp16/fp8) to dense
    TFLOP/s; a dtype missing from it is not supported by the device's matrix units."""

    name: str
    peak_tflops: dict[str, float]
    memory_gib: float
    memory_bandwidth_gbps: float
    link: Link  # the vendor's default intra-node link (NVLink, HCCS, UB, PCIe)
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.peak_tflops:
            raise SpecError(f"device {self.name}: peak_tflops needs at least one dtype")
        for dtype, tflops in self.peak_tflops.items():
            if dtype not in DTYPES:
                raise SpecError(
                    f"device {self.name}: peak_tflops.{dtype}: unknown dtype; "
                    f"allowed: {', '.join(DTYPES)}"
                )
            if not isinstance(tflops, (int, float)) or tflops <= 0:
                raise SpecError(
                    f"device {self.name}: peak_tflops.{dtype} must be a positive number"
                )
        for name in ("memory_gib", "memory_bandwidth_gbps"):
            if getattr(self, name) <= 0:
                raise SpecError(f"device {self.name}: {name} must be > 0")

    def __hash__(self) -> int:  # peak_tflops is a dict; the name identifies a device
        return hash(self.name)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s for ``dtype``."""
        if dtype not in self.peak_tflops:
            raise SpecError(
                f"device {self.name} has no {dtype} peak; it supports {', '.join(self.peak_tflops)}"
            )
        return self.peak_tflops[dtype] * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)
