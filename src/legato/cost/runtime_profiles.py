"""Framework runtimes as named profiles: FSDP1, FSDP2, torchtitan, Megatron-Core with
Transformer Engine, DeepSpeed ZeRO.

A profile is a few discrete behaviours of a framework (what overlaps with what, how its
weights are gathered and prefetched, its bucket sizes, its fused kernels), each a field of
``Runtime`` with the line of the framework's own source or documentation that states it
(``data/runtime_profiles.toml``). Profiles are data so that a behaviour is changed where
its evidence sits, and so that no continuous efficiency factor can hide in one: a value
is a flag, a count or a framework's documented default, never fitted.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import tomllib

from legato.errors import ConfigError

PROFILE_FILE = "data/runtime_profiles.toml"


@cache
def _profiles() -> dict[str, dict[str, Any]]:
    text = resources.files("legato.cost").joinpath(PROFILE_FILE).read_text()
    return tomllib.loads(text)


def profile_names() -> tuple[str, ...]:
    return tuple(_profiles())


def profile_behaviours(name: str, where: str = "runtime") -> dict[str, Any]:
    """The Runtime fields profile ``name`` sets, by field name; ConfigError (one line,
    naming the known profiles) for an unknown name."""
    table = _profiles().get(name)
    if table is None:
        known = ", ".join(profile_names())
        raise ConfigError(f"{where}.profile: unknown runtime profile {name!r}; known: {known}")
    return {key: item["value"] for key, item in table.items() if isinstance(item, dict)}


def profile_evidence(name: str) -> dict[str, str]:
    """Each behaviour of profile ``name`` and where its framework documents it."""
    table = _profiles()[name]
    return {key: item["evidence"] for key, item in table.items() if isinstance(item, dict)}
