"""``legato models`` and ``legato hardware``: the presets, with exact sizes and links.

``legato hardware`` also names, per device, the laws of its device profile that keep
datasheet priors or were transferred from the same silicon (``DeviceProfile.unfitted``):
no micro-benchmark of that device measured them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rich import box
from rich.console import Console
from rich.table import Table

from legato.cost.flops import training_flops_per_token
from legato.devices.registry import profile_for
from legato.specs import (
    ClusterSpec,
    DeviceSpec,
    ModelSpec,
    count_params,
    list_clusters,
    list_devices,
    list_models,
    load_cluster,
    load_device,
    load_model,
)
from legato.specs.typed import to_dict


def register(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser("models", help="list model presets with exact parameter counts")
    models.add_argument(
        "models", nargs="*", metavar="MODEL", help="preset names or model files (default: all)"
    )
    models.add_argument("--json", action="store_true", help="print JSON instead of a table")
    models.set_defaults(func=_run_models)

    hardware = subparsers.add_parser("hardware", help="list device and cluster presets")
    hardware.add_argument(
        "clusters", nargs="*", metavar="CLUSTER", help="cluster presets or files (default: all)"
    )
    hardware.add_argument("--nodes", type=int, default=None, help="nodes of each cluster")
    hardware.add_argument("--json", action="store_true", help="print JSON instead of tables")
    hardware.set_defaults(func=_run_hardware)


def _model_row(spec: ModelSpec) -> dict:
    count = count_params(spec)
    published = spec.published_params
    return {
        "name": spec.name,
        "description": spec.description,
        "params": asdict(count),
        "published_params": published,
        "published_diff_pct": 100 * (count.total / published - 1) if published else None,
        "training_flops_per_token": training_flops_per_token(spec),
        "spec": to_dict(spec),
    }


def _billions(n: float | None) -> str:
    return "" if n is None else f"{n / 1e9:.4g}"


def _console() -> Console:
    """A console that does not squeeze wide tables when the output is piped."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _models_table(rows: list[dict]) -> Table:
    table = Table(title="Model presets (params in billions, exact)", box=box.SIMPLE)
    columns = "name params active layers hidden heads/kv ffn(expert) experts/top-k+shared"
    for column in (*columns.split(), "vocab", "seq", "published", "diff %"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for row in rows:
        spec, params = row["spec"], row["params"]
        moe = spec["moe"]
        experts = ""
        if moe:
            experts = f"{moe['num_experts']}/{moe['top_k']}"
            if moe["num_shared_experts"]:
                experts += f"+{moe['num_shared_experts']}"
        ffn = moe["expert_ffn_hidden_size"] if moe else spec["ffn_hidden_size"]
        diff = row["published_diff_pct"]
        table.add_row(
            row["name"],
            _billions(params["total"]),
            _billions(params["active"]) if moe else "",
            str(spec["num_layers"]),
            str(spec["hidden_size"]),
            f"{spec['num_heads']}/{spec['num_kv_heads']}" + (" MLA" if spec["mla"] else ""),
            str(ffn),
            experts,
            str(spec["vocab_size"]),
            str(spec["seq_len"]),
            _billions(row["published_params"]),
            "" if diff is None else f"{diff:+.2f}",
        )
    return table


def _run_models(args: argparse.Namespace, extra: list[str]) -> int:
    rows = [_model_row(load_model(source)) for source in args.models or list_models()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _console().print(_models_table(rows))
    return 0


def _cluster_row(cluster: ClusterSpec) -> dict:
    return {
        "name": cluster.name,
        "description": cluster.description,
        "device": cluster.device.name,
        "nodes": cluster.nodes,
        "devices_per_node": cluster.devices_per_node,
        "world_size": cluster.world_size,
        "levels": [asdict(level) for level in cluster.levels],
    }


def _device_row(device: DeviceSpec) -> dict:
    """The device's spec and the laws of its profile no micro-benchmark of it fitted."""
    profile = profile_for(device)
    return {**to_dict(device), "unfitted": profile.unfitted(), "profile_laws": len(profile.fits())}


def _unfitted_cell(device: dict) -> str:
    unfitted = device["unfitted"]
    if not unfitted:
        return "-"
    if len(unfitted) == device["profile_laws"]:
        return "all (datasheet priors)"
    return ", ".join(unfitted)


def _hardware_tables(devices: list[dict], clusters: list[dict]) -> tuple[Table, Table]:
    device_table = Table(title="Devices (dense peak; GB/s = 1e9 bytes/s; unfitted: profile "
                         "laws no micro-benchmark of the device fitted)", box=box.SIMPLE)  # fmt: skip
    columns = ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "memory GiB", "HBM GB/s", "link", "unfitted")
    for column in columns:
        device_table.add_column(
            column, justify="left" if column in ("name", "link", "unfitted") else "right"
        )
    for device in devices:
        peaks = device["peak_tflops"]
        link = device["link"]
        device_table.add_row(
            device["name"],
            f"{peaks['bf16']:g}" if "bf16" in peaks else "-",
            f"{peaks['fp8']:g}" if "fp8" in peaks else "-",
            f"{device['memory_gib']:g}",
            f"{device['memory_bandwidth_gbps']:g}",
            f"{link['name']}: {link['bandwidth_gbps']:g} GB/s",
            _unfitted_cell(device),
        )
    cluster_table = Table(
        title="Clusters (link bandwidth per device, one direction)", box=box.SIMPLE
    )
    for column in ("name", "device", "nodes x per node", "link levels (inner to outer)"):
        cluster_table.add_column(column)
    for cluster in clusters:
        levels = "\n".join(
            f"{lv['name']}: {lv['bandwidth_gbps']:g} GB/s, {lv['latency_us']:g} us, "
            f"{lv['span']} devices"
            for lv in cluster["levels"]
        )
        shape = f"{cluster['nodes']} x {cluster['devices_per_node']}"
        cluster_table.add_row(cluster["name"], cluster["device"], shape, levels)
    return device_table, cluster_table


def _run_hardware(args: argparse.Namespace, extra: list[str]) -> int:
    specs = [load_cluster(source, nodes=args.nodes) for source in args.clusters or list_clusters()]
    if args.clusters:  # only the devices of the clusters asked for
        shown = list({spec.device.name: spec.device for spec in specs}.values())
    else:
        shown = [load_device(name) for name in list_devices()]
    devices = [_device_row(device) for device in shown]
    clusters = [_cluster_row(spec) for spec in specs]
    if args.json:
        print(json.dumps({"devices": devices, "clusters": clusters}, indent=2))
    else:
        console = _console()
        for table in _hardware_tables(devices, clusters):
            console.print(table)
    return 0
