"""Time of the collectives a training step issues, from the device profile.

A group of ``p`` devices whose slowest link is ``link`` (a ``LinkLevel``: its nominal
bandwidth per device, its latency and which level it is) runs each collective as the
profile's law for that level says (``legato.devices.collectives``: NCCL's ring and tree
algorithms and protocols on a GPU, alpha-beta fits of a host ``legato calibrate``
measured). ``nbytes`` as there: the gathered tensor for all-gather and reduce-scatter, one
rank's buffer for all-to-all and all-reduce, one message for p2p.
"""

from __future__ import annotations

from legato.devices.collectives import COLLECTIVES, Collective, steps_and_wire_bytes
from legato.devices.profile import DeviceProfile
from legato.specs.cluster import LinkLevel
from legato.specs.device import Link

__all__ = ["COLLECTIVES", "Collective", "collective_time", "steps_and_wire_bytes"]


def collective_time(
    kind: Collective,
    nbytes: float,
    p: int,
    link: Link,
    profile: DeviceProfile,
    *,
    bandwidth_share: float = 1.0,
) -> float:
    """Seconds for one collective on a group of ``p`` devices whose slowest link is
    ``link``; ``bandwidth_share`` (0-1] is the part of the link left by concurrent traffic
    of other mesh axes. Zero for a group of one (nothing is sent)."""
    level = link.level if isinstance(link, LinkLevel) else "intra_node"
    bandwidth = link.bandwidth_gbps * bandwidth_share
    return profile.collective_time(kind, nbytes, p, bandwidth, link.latency_us, level)
