"""Load model, device and cluster specs by preset name, from a file, or from a dict.

Presets are TOML data files under ``specs/presets/`` (``models/*.toml``, ``devices.toml``,
``clusters.toml``); each top-level table is one preset, and an optional ``[defaults]``
table holds keys shared by every preset in its file. A user file has the same keys as
one preset table: ModelSpec field names (with optional ``[moe]`` / ``[mla]`` tables) for
a model; for a cluster ``device`` (a device preset name, file or table), ``nodes``,
``devices_per_node``, ``[intra_node]`` and ``[inter_node]`` (``bandwidth_gbps``,
``latency_us``, optional ``name``) and an optional ``[supernode]`` (the same plus
``nodes``, the nodes per supernode). Every problem is one SpecError naming the field (a
Hugging Face folder's, a ConfigError naming its ``config.json`` and the key).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from legato.errors import SpecError
from legato.specs.cluster import ClusterSpec, LinkLevel
from legato.specs.device import DeviceSpec, Link
from legato.specs.hf_config import is_hf_folder, read_spec
from legato.specs.model import ModelSpec
from legato.specs.typed import from_dict, read_table_file, tomllib

Source = str | os.PathLike | dict[str, Any]


@dataclass(frozen=True)
class _LinkTable:
    bandwidth_gbps: float
    latency_us: float
    name: str = ""


@dataclass(frozen=True)
class _SupernodeTable:
    bandwidth_gbps: float
    latency_us: float
    nodes: int
    name: str = "supernode"


@dataclass(frozen=True)
class _ClusterTable:
    """The keys of a cluster file (a contract with users; see the module docstring)."""

    name: str
    device: str | dict[str, Any]
    devices_per_node: int
    nodes: int = 1
    intra_node: _LinkTable | None = None
    inter_node: _LinkTable | None = None
    supernode: _SupernodeTable | None = None
    description: str = ""


def _presets_dir():
    return resources.files("legato.specs") / "presets"


def _read_presets(resource) -> dict[str, dict[str, Any]]:
    """Preset tables of one TOML file, each merged over the file's ``[defaults]``."""
    try:
        data = tomllib.loads(resource.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # a packaging bug, not a user error
        raise SpecError(f"preset file {resource.name} is malformed: {exc}") from None
    defaults = data.pop("defaults", {})
    tables = {}
    for name, table in data.items():
        merged = {**defaults, **table}
        for key, value in table.items():
            if isinstance(value, dict) and isinstance(defaults.get(key), dict):
                merged[key] = {**defaults[key], **value}
        tables[name] = merged
    return tables


@cache
def _model_presets() -> dict[str, dict[str, Any]]:
    presets: dict[str, dict[str, Any]] = {}
    files = sorted(_presets_dir().joinpath("models").iterdir(), key=lambda f: f.name)
    for resource in files:
        if not resource.name.endswith(".toml"):
            continue
        for name, table in _read_presets(resource).items():
            if name in presets:
                raise SpecError(f"model preset {name!r} is defined twice")
            presets[name] = table
    return presets


@cache
def _presets(filename: str) -> dict[str, dict[str, Any]]:
    return _read_presets(_presets_dir().joinpath(filename))


def _unknown(kind: str, name: str, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SpecError(f"unknown {kind} {name!r}{hint}; known {kind}s: {', '.join(known)}")


def _resolve(source: Source, kind: str, presets: dict[str, dict]) -> tuple[dict, str]:
    """(table with a ``name``, origin for error messages) of a preset, file or dict."""
    if isinstance(source, dict):
        return {"name": "custom", **source}, ""
    text = os.fspath(source)
    is_path = isinstance(source, os.PathLike) or Path(text).suffix in (".toml", ".json")
    if is_path or os.sep in text:
        return {"name": Path(text).stem, **read_table_file(text, SpecError)}, text
    if text not in presets:
        raise _unknown(kind, text, list(presets))
    return {**presets[text], "name": text}, ""


@contextmanager
def _errors_from(origin: str) -> Iterator[None]:
    """Prefix errors with the file they come from (presets and dicts need no prefix)."""
    try:
        yield
    except SpecError as exc:
        if not origin:
            raise
        raise SpecError(f"{origin}: {exc}") from None


def list_models() -> list[str]:
    return list(_model_presets())


def list_devices() -> list[str]:
    return list(_presets("devices.toml"))


def list_clusters() -> list[str]:
    return list(_presets("clusters.toml"))


def load_model(source: Source) -> ModelSpec:
    """A ModelSpec from a preset name, a ``.toml``/``.json`` file, a Hugging Face model
    folder (its ``config.json``, ``hf_config``) or a parsed dict."""
    if not isinstance(source, dict) and is_hf_folder(source):
        return read_spec(source)
    table, origin = _resolve(source, "model", _model_presets())
    with _errors_from(origin):
        return from_dict(ModelSpec, table, "model", SpecError)


def load_device(source: Source) -> DeviceSpec:
    """A DeviceSpec from a preset name, a ``.toml``/``.json`` file or a parsed dict."""
    table, origin = _resolve(source, "device", _presets("devices.toml"))
    with _errors_from(origin):
        return from_dict(DeviceSpec, table, "device", SpecError)


def load_cluster(
    source: Source, nodes: int | None = None, devices_per_node: int | None = None
) -> ClusterSpec:
    """A ClusterSpec from a node-type preset, a file or a dict; ``nodes`` and
    ``devices_per_node`` override the file's values (e.g. the processes launched)."""
    table, origin = _resolve(source, "cluster", _presets("clusters.toml"))
    with _errors_from(origin):
        spec = from_dict(_ClusterTable, table, "cluster", SpecError)
        return _assemble(
            spec,
            spec.nodes if nodes is None else nodes,
            spec.devices_per_node if devices_per_node is None else devices_per_node,
        )


def _assemble(table: _ClusterTable, nodes: int, per_node: int) -> ClusterSpec:
    """Link levels inner to outer: node, supernode (capped at the world), whole cluster."""
    for key, value in (("nodes", nodes), ("devices_per_node", per_node)):
        if value < 1:
            raise SpecError(f"cluster.{key} must be >= 1, got {value}")
    device = load_device(table.device)
    world = nodes * per_node
    intra = table.intra_node or device.link
    # an unnamed link of the user's own is named by its figures, not by the device's link
    label = intra.name or f"intra-node ({intra.bandwidth_gbps:g} GB/s per direction)"
    levels = [_level("intra_node", intra, label, per_node)]
    covered_nodes = 1
    if table.supernode is not None:
        sn = table.supernode
        if sn.nodes < 1:
            raise SpecError(f"cluster.supernode.nodes must be >= 1, got {sn.nodes}")
        covered_nodes = sn.nodes
        levels.append(_level("supernode", sn, sn.name, min(sn.nodes * per_node, world)))
    if table.inter_node is not None:
        inter = table.inter_node
        levels.append(_level("inter_node", inter, inter.name or "inter-node", world))
    elif nodes > covered_nodes:
        raise SpecError(f"cluster.inter_node: required for {nodes} nodes (the table is missing)")
    return ClusterSpec(table.name, device, nodes, per_node, tuple(levels), table.description)


def _level(key: str, link: _LinkTable | _SupernodeTable | Link, name: str, span: int) -> LinkLevel:
    try:
        return LinkLevel(name, link.bandwidth_gbps, link.latency_us, span, key)
    except SpecError as exc:
        raise SpecError(f"cluster.{key}: {exc}") from None
