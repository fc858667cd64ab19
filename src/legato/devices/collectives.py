"""Collectives as NCCL runs them: ring and tree algorithms, LL/LL128/Simple protocols.

For ``p`` ranks and a tensor of ``nbytes`` (the gathered tensor for all-gather and
reduce-scatter, one rank's buffer for all-to-all and all-reduce, one message for p2p) the
ring sends ``wire`` bytes per rank in ``steps`` latency steps (``steps_and_wire_bytes``):
all-gather / reduce-scatter / all-to-all ``p-1`` steps and ``(p-1)/p nbytes``, all-reduce
twice that, p2p one step and ``nbytes``. NCCL's tuner (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` in NVIDIA/nccl@01afd20a ``src/graph/tuning.cc``) prices every
(algorithm, protocol) as ``base latency + steps x hardware latency + bytes / bandwidth``
and runs the cheapest; ``nccl_time`` does the same with its constants:

* latencies (us): ``baseLat`` and ``hwLat`` per link kind (NVLink inside a node, the
  network across nodes), ring steps as above, the tree ``2 log2(p)`` network hops (all-reduce only);
* bandwidth: LL moves 8-byte lines holding 4 data bytes and runs at 1/4 of the ring's
  bus bandwidth for all-reduce (1/3 otherwise), LL128 at 0.92, Simple at all of it; the
  tree at 0.9 of it (LL 1/3.8 of that, LL128 7/9 inside a node and 0.915 across), and an
  all-reduce tree moves ``2 nbytes`` through each rank whatever ``p``.

What the profile fits per link level (``LevelLaw``) is the bus bandwidth Simple reaches as
a share of the link's nominal figure, and the time each call pays on top (the launch
through ``torch.distributed``, kernel start), from nccl-tests and Vidur's sweeps.
A level may instead give per-kind alpha-beta fits (``kinds``): gloo on a CPU host
implements each collective its own way (``legato calibrate`` measures them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from legato.devices.laws import Fit

Collective = Literal["all_gather", "reduce_scatter", "all_to_all", "all_reduce", "p2p"]
COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce", "p2p")
LEVELS: tuple[str, ...] = ("intra_node", "supernode", "inter_node")
PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL tuning.cc: baseLat[algo][proto] and hwLat[hw][algo][proto], microseconds.
BASE_LATENCY_US = {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)}
HW_LATENCY_US = {
    "nvlink": {"tree": (0.52, 1.2, 28.0), "ring": (0.47, 1.9, 3.4)},
    "net": {"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)},
}


def steps_and_wire_bytes(kind: str, nbytes: float, p: int) -> tuple[int, float]:
    """(latency steps, bytes each rank sends) of the ring algorithm."""
    if kind == "p2p":
        return 1, nbytes
    if p <= 1:
        return 0, 0.0
    share = (p - 1) / p
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return p - 1, nbytes * share
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * nbytes * share
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")


def ideal_time(kind: str, nbytes: float, p: int, latency_s: float, bandwidth: float) -> float:
    """The textbook alpha-beta time (seconds), ``bandwidth`` in bytes/s."""
    steps, wire = steps_and_wire_bytes(kind, nbytes, p)
    return steps * latency_s + wire / bandwidth


def _ring_share(kind: str, protocol: str, multi_node: bool) -> float:
    if protocol == "LL":
        return 0.25 if multi_node or kind == "all_reduce" else 1 / 3
    return 0.92 if protocol == "LL128" else 1.0


def _tree_share(protocol: str, multi_node: bool) -> float:
    if protocol == "LL":
        return 0.9 / 3.8
    if protocol == "LL128":
        return 0.9 * (0.915 if multi_node else 7 / 9)
    return 0.9


def nccl_time(kind: str, nbytes: float, p: int, bus_bandwidth: float, network: bool) -> float:
    """Seconds NCCL's cheapest (algorithm, protocol) takes, ``bus_bandwidth`` in bytes/s
    (what Simple's ring reaches); ``network``: the group crosses nodes."""
    steps, wire = steps_and_wire_bytes(kind, nbytes, p)
    hw = HW_LATENCY_US["net" if network else "nvlink"]
    best = math.inf
    for i, protocol in enumerate(PROTOCOLS):
        latency = BASE_LATENCY_US["ring"][i] + steps * hw["ring"][i]
        rate = bus_bandwidth * _ring_share(kind, protocol, network)
        best = min(best, latency * 1e-6 + wire / rate)
        if kind == "all_reduce" and p > 2:
            hops = 2 * (math.log2(p) if network else p - 1)
            latency = BASE_LATENCY_US["tree"][i] + hops * hw["tree"][i]
            rate = bus_bandwidth * _tree_share(protocol, network)
            best = min(best, latency * 1e-6 + 2 * nbytes / rate)
    return best


@dataclass(frozen=True)
class LevelLaw:
    """Collectives over one link level. ``bus_fraction``: the bus bandwidth NCCL's Simple
    ring reaches, as a share of the link's nominal per-device figure (above 1 where NVLink
    SHARP (NVLS) beats the ring); ``call_latency_us``: what each call pays on top of NCCL's
    own latencies. ``kinds``: per collective kind, ``(latency_us per ring step,
    bandwidth_gbps)`` of an alpha-beta fit that replaces the NCCL model for that kind
    (``algorithm = "alpha_beta"``: every kind is alpha-beta, the link's figures by default)."""

    bus_fraction: float
    call_latency_us: float
    algorithm: Literal["nccl", "alpha_beta"] = "nccl"
    kinds: dict[str, tuple[float, float]] = field(default_factory=dict)
    fit: Fit = field(default_factory=Fit)

    def time(
        self, kind: str, nbytes: float, p: int, bandwidth_gbps: float, latency_us: float,
        network: bool,
    ) -> float:  # fmt: skip
        """Seconds over a link of ``bandwidth_gbps`` per device (``latency_us`` per step
        for the alpha-beta law)."""
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
        call = self.call_latency_us * 1e-6
        if kind in self.kinds or self.algorithm == "alpha_beta":
            latency_us, bandwidth_gbps = self.kinds.get(kind, (latency_us, bandwidth_gbps))
            rate = bandwidth_gbps * 1e9 * self.bus_fraction
            return call + ideal_time(kind, nbytes, p, latency_us * 1e-6, rate)
        return call + nccl_time(kind, nbytes, p, bandwidth_gbps * 1e9 * self.bus_fraction, network)
