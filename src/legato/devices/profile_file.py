"""A device profile as a TOML file a user can read, edit and replace.

Top-level keys ``device`` and ``description``; one table per law: ``[gemm.<dtype>]``,
``[attention.<dtype>]``, ``[memory]``, ``[host_link]``, ``[host]``,
``[collectives.<level>]``, each with its constants and a ``fit`` table (``fitted``,
``evidence``, ``held_out_median_pct``, ``held_out_mean_pct``; ``host`` has a second one,
``step_fit``). The format is documented in docs/cost_model.md. Bad input is one
SpecError naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from legato.devices.collectives import COLLECTIVES, LevelLaw
from legato.devices.laws import AttentionLaw, Fit, GemmLaw, HostLaw, HostLinkLaw, MemoryLaw
from legato.devices.profile import DTYPE_BYTES, DeviceProfile
from legato.errors import SpecError
from legato.specs.typed import from_dict, read_table_file, toml_literal

# constants that may be zero (a latency, a half-efficiency size); every other one is > 0
MAY_BE_ZERO = ("latency_us", "call_latency_us", "half_dim", "q_half", "kv_half", "step_base_ms",
               "step_per_sequence_ms", "launch_us")  # fmt: skip


def _checked(law: Any, where: str) -> Any:
    for f in dataclasses.fields(law):
        value = getattr(law, f.name)
        if not isinstance(value, float):
            continue
        if value < 0 or (value == 0 and f.name not in MAY_BE_ZERO):
            bound = ">= 0" if f.name in MAY_BE_ZERO else "> 0"
            raise SpecError(f"{where}.{f.name} must be {bound}, got {value}")
    return law


def _law(cls: type, table: Any, where: str) -> Any:
    if not isinstance(table, dict):
        raise SpecError(f"{where}: expected a table")
    return _checked(from_dict(cls, table, where, SpecError), where)


def _by_name(cls: type, tables: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(tables, dict):
        raise SpecError(f"{where}: expected a table of tables")
    for name in tables:
        if name not in allowed:
            raise SpecError(f"{where}.{name}: unknown; allowed: {', '.join(allowed)}")
    return {name: _law(cls, t, f"{where}.{name}") for name, t in tables.items()}


def _level(table: Any, where: str) -> LevelLaw:
    law = _law(LevelLaw, table, where)
    for kind, pair in law.kinds.items():
        ok = kind in COLLECTIVES and isinstance(pair, (list, tuple)) and len(pair) == 2
        if not ok or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in pair):
            raise SpecError(f"{where}.kinds.{kind}: expected [latency_us, bandwidth_gbps] for "
                            f"one of {', '.join(COLLECTIVES)}, got {pair!r}")  # fmt: skip
        if pair[1] <= 0 or pair[0] < 0:
            raise SpecError(f"{where}.kinds.{kind}: latency must be >= 0 and bandwidth > 0")
    kinds = {k: (float(a), float(b)) for k, (a, b) in law.kinds.items()}
    return dataclasses.replace(law, kinds=kinds)


SECTIONS = ("device", "description", "gemm", "attention", "memory", "host_link", "host",
            "collectives")  # fmt: skip


def profile_from_dict(data: dict[str, Any], where: str = "profile") -> DeviceProfile:
    """A DeviceProfile from a parsed profile file (see the module docstring)."""
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(SECTIONS)}")
    for key in SECTIONS[2:]:
        if key not in data:
            raise SpecError(f"{where}.{key}: required table is missing")
    if not isinstance(data.get("device"), str):
        raise SpecError(f"{where}.device: expected the device's name (a string)")
    dtypes = tuple(DTYPE_BYTES)
    levels = data["collectives"]
    if not isinstance(levels, dict):
        raise SpecError(f"{where}.collectives: expected a table of tables")
    return DeviceProfile(
        device=data["device"],
        description=str(data.get("description", "")),
        gemm=_by_name(GemmLaw, data["gemm"], f"{where}.gemm", dtypes),
        attention=_by_name(AttentionLaw, data["attention"], f"{where}.attention", dtypes),
        memory=_law(MemoryLaw, data["memory"], f"{where}.memory"),
        host_link=_law(HostLinkLaw, data["host_link"], f"{where}.host_link"),
        host=_law(HostLaw, data["host"], f"{where}.host"),
        collectives={lv: _level(t, f"{where}.collectives.{lv}") for lv, t in levels.items()},
    )


def read_profile(path: str | Path) -> DeviceProfile:
    """The profile in TOML (or JSON) file ``path``."""
    return profile_from_dict(read_table_file(path, SpecError), str(path))


def _fit_items(fit: Fit) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(fit).items() if v is not None and v != ""}


def _table(name: str, law: Any) -> list[str]:
    lines = ["", f"[{name}]"]
    for f in dataclasses.fields(law):
        value = getattr(law, f.name)
        if isinstance(value, Fit):
            lines.append(f"{f.name} = {toml_literal(_fit_items(value))}")
        elif isinstance(value, dict):
            if value:
                lines.append(f"{f.name} = {toml_literal({k: list(v) for k, v in value.items()})}")
        else:
            lines.append(f"{f.name} = {toml_literal(value)}")
    return lines


def render_profile(profile: DeviceProfile, header: list[str]) -> str:
    """The profile as TOML, ``header`` lines as comments on top."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"device = {toml_literal(profile.device)}"]
    lines += [f"description = {toml_literal(profile.description)}"]
    for dtype, law in profile.gemm.items():
        lines += _table(f"gemm.{dtype}", law)
    for dtype, law in profile.attention.items():
        lines += _table(f"attention.{dtype}", law)
    lines += _table("memory", profile.memory)
    lines += _table("host_link", profile.host_link)
    lines += _table("host", profile.host)
    for level, law in profile.collectives.items():
        lines += _table(f"collectives.{level}", law)
    return "\n".join(lines) + "\n"
