"""Packing policies by name: Gimbal and the baselines it is measured against."""

from __future__ import annotations

from collections.abc import Callable

from legato.cluster.policies.fifo import Fifo
from legato.cluster.policies.gandiva import Gandiva
from legato.cluster.policies.gavel import Gavel
from legato.cluster.policies.gimbal import Gimbal
from legato.cluster.policies.lucid import Lucid
from legato.cluster.policies.tiresias import Tiresias
from legato.cluster.simulator import Policy
from legato.errors import ConfigError

POLICIES: dict[str, Callable[[], Policy]] = {
    "fifo": Fifo,
    "tiresias": Tiresias,
    "gandiva": Gandiva,
    "gavel": Gavel,
    "lucid": Lucid,
    "gimbal": Gimbal,
}


def make_policy(name: str) -> Policy:
    """The policy ``name``; one clear line naming the known ones otherwise."""
    if name not in POLICIES:
        raise ConfigError(f"--policy: unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]()
