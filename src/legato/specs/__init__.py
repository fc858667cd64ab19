"""Specs: what is trained (ModelSpec) and on what (DeviceSpec, ClusterSpec), plus presets."""

from legato.specs.cluster import ClusterSpec, LinkLevel
from legato.specs.device import DTYPES, DeviceSpec, Link
from legato.specs.model import MLASpec, ModelSpec, MoESpec
from legato.specs.params import ParamCount, count_params, layer_params
from legato.specs.registry import (
    list_clusters,
    list_devices,
    list_models,
    load_cluster,
    load_device,
    load_model,
)

__all__ = [
    "DTYPES",
    "ClusterSpec",
    "DeviceSpec",
    "Link",
    "LinkLevel",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "ParamCount",
    "count_params",
    "layer_params",
    "list_clusters",
    "list_devices",
    "list_models",
    "load_cluster",
    "load_device",
    "load_model",
]
