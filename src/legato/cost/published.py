"""Published training runs as (model, cluster, strategy) triples, and the cost model's error.

Each row of ``data/published_runs.csv`` becomes a ModelSpec (from its shape columns, or
the preset of its model name when they are empty), a ClusterSpec (the DGX preset of its
GPU) and a Strategy (its layout columns); gaps are filled the way the source describes
(each assumption is listed in ``ASSUMPTIONS``). The prediction is converted into the
row's own metric with the source's own FLOP formula, so predicted and published values
compare like for like.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from legato.cost.calibration import CALIBRATION, Calibration
from legato.cost.flops import forward_flops, training_step_flops
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime
from legato.cost.training_step import predict
from legato.specs.cluster import ClusterSpec
from legato.specs.model import ModelSpec
from legato.specs.registry import load_cluster, load_model
from legato.specs.strategy import Strategy

ASSUMPTIONS = {
    "Narayanan2021": "MBS 1 (not in the table); interleaved with 2 chunks per device where "
    "the layers per stage are even, else plain 1F1B; no sequence parallelism (it came in "
    "2022); materialised attention with dropout; gradients all-reduced after the backward "
    "(2021 Megatron-LM did not overlap them)",
    "Korthikanti2022": "full rows: TP without SP; selective+SP rows: SP and selective "
    "recompute; materialised attention with dropout; text row: GBS 1920 and MBS 1 (MT-NLG's "
    "run on the same 2240 GPUs) and 3 chunks per device (Table 5's 530B layout)",
    "Smith2022": "DeepSpeed pipeline engine: plain 1F1B, gradients reduced after the "
    "pipeline drains; materialised attention with dropout; no SP",
    "Llama3": "126 layers run as 128-layer stages (the paper drops one layer from the first "
    "and last stage, which hold the embedding and head): time a 128-layer model, count "
    "FLOPs of 126; FSDP that keeps weights gathered through the step = ZeRO-2; SP on; "
    "interleaved with 8 one-layer chunks per device (the paper's first chunk holds only the "
    "embedding, so 126 layers + embedding + head fill 16 x 8 chunks); MBS 1; recompute not reported and the paper "
    "saves memory by stage balancing instead: none; RoCE 400 Gb/s per GPU between nodes",
    "torchtitan": "FSDP2 full shard = ZeRO-3 with fp32 gradient reduction; eager "
    "PyTorch elementwise ops (torch.compile was off by default); 'selective "
    "layer'/'selective op' = selective; fused attention; DGX A100 network",
}

H100_ROCE = {
    "name": "dgx-h100-roce",
    "device": "h100",
    "devices_per_node": 8,
    "intra_node": {"name": "NVLink 4", "bandwidth_gbps": 450, "latency_us": 2.0},
    "inter_node": {"name": "RoCE 400 Gb/s per GPU", "bandwidth_gbps": 50, "latency_us": 8.0},
}
PRESET_NAMES = {
    "Llama3-8B": "llama3-8b",
    "Llama3-70B": "llama3-70b",
    "Llama2-13B": "llama2-13b",
    "Llama2-70B": "llama2-70b",
}


@dataclass(frozen=True)
class Case:
    """One published run, ready to predict."""

    row: dict[str, str]
    family: str  # key of ASSUMPTIONS
    model: ModelSpec  # what is timed
    counted: ModelSpec  # what the source's FLOP formula counts
    cluster: ClusterSpec
    strategy: Strategy
    runtime: Runtime
    overlap: bool

    @property
    def published(self) -> float:
        return float(self.row["value"])


def read_rows() -> list[dict[str, str]]:
    text = resources.files("legato.cost").joinpath("data/published_runs.csv").read_text()
    return list(csv.DictReader(text.splitlines()))


def _int(row: dict[str, str], key: str, default: int = 1) -> int:
    value = row.get(key, "").strip()
    return int(value) if value else default


FAMILIES = (  # source column prefix -> key of ASSUMPTIONS
    ("Narayanan2021", "Narayanan2021"),
    ("Korthikanti2022", "Korthikanti2022"),
    ("Smith2022", "Smith2022"),
    ("Llama3", "Llama3"),
    ("pytorch/torchtitan", "torchtitan"),
)


def _family(source: str) -> str:
    for prefix, family in FAMILIES:
        if source.startswith(prefix):
            return family
    raise ValueError(f"published_runs.csv: unknown source {source!r}")


def _model(row: dict[str, str]) -> ModelSpec:
    if not row["layers"]:
        return load_model(PRESET_NAMES[row["model"]]).with_(seq_len=_int(row, "seq"))
    shape = {
        "name": row["row_id"],
        "num_layers": _int(row, "layers"),
        "hidden_size": _int(row, "hidden"),
        "num_heads": _int(row, "heads"),
        "vocab_size": _int(row, "vocab"),
        "seq_len": _int(row, "seq"),
    }
    if row["model"].startswith("Llama"):
        return ModelSpec(
            **shape,
            num_kv_heads=_int(row, "kv_heads"),
            ffn_hidden_size=_int(row, "ffn"),
            tied_embeddings=False,
        )
    return ModelSpec(
        **shape,
        ffn_hidden_size=_int(row, "ffn", 4 * shape["hidden_size"]),
        mlp="gelu",
        norm="layernorm",
        position="learned",
        bias=True,
        tied_embeddings=True,
    )


def _cluster(row: dict[str, str]) -> ClusterSpec:
    nodes = _int(row, "n_gpus") // 8
    if row["gpu"].startswith("H100"):
        return load_cluster({**H100_ROCE, "nodes": nodes})
    return load_cluster("dgx-a100", nodes=nodes)


def build_case(row: dict[str, str]) -> Case:
    """The model, cluster, strategy and runtime of one CSV row (see ASSUMPTIONS)."""
    family = _family(row["source"])
    model = counted = _model(row)
    recompute = row["recompute"]
    fields: dict[str, Any] = {k.lower(): _int(row, k) for k in ("TP", "PP", "DP", "CP", "MBS")}
    fields.update(dtype=row["precision"], gbs=_int(row, "GBS", 0), vpp=_int(row, "VPP"))
    fields["recompute"] = "none" if recompute == "unknown" else recompute.split()[0].split("+")[0]
    runtime, overlap = Runtime(flash_attention=False, dropout=True), False  # Megatron, DeepSpeed
    if family == "Narayanan2021":
        fields["vpp"] = 2 if fields["pp"] > 1 and (model.num_layers // fields["pp"]) % 2 == 0 else 1
    elif family == "Korthikanti2022":
        fields["sp"] = recompute.startswith("selective")
        if not row["GBS"]:  # the text row: MT-NLG's batch and Table 5's 530B layout
            fields.update(gbs=1920, vpp=3)
    elif family == "Llama3":
        model = model.with_(num_layers=128)
        runtime, overlap = Runtime(), True
        fields.update(sp=True, zero=2, vpp=8)
    elif family == "torchtitan":
        runtime = Runtime(fused_elementwise=False, grad_reduce_bytes=4)
        overlap = True
        fields["zero"] = 3
    fields["schedule"] = "interleaved" if fields["vpp"] > 1 else "1f1b"
    strategy = Strategy(**fields)
    return Case(row, family, model, counted, _cluster(row), strategy, runtime, overlap)


def metric_value(case: Case, prediction: Prediction) -> float:
    """The prediction in the row's metric, with the source's FLOP accounting."""
    row, model, s = case.row, case.counted, case.strategy
    seconds, gpus = prediction.step_time_s, case.cluster.world_size
    metric = row["metric"]
    if metric == "iteration time":
        return seconds
    if metric.startswith("tokens/s"):
        return prediction.tokens_per_s / gpus
    if metric.startswith("TFLOP/s/GPU (eq.3"):  # Megatron's eq. 3: full recompute, s x s
        flops = training_step_flops(model, s.gbs, model.seq_len, "full", causal=False)
        return flops / seconds / gpus / 1e12
    if metric == "MFU":  # Korthikanti: eq. 3 without recompute, in % of the fp16 peak
        flops = 3 * forward_flops(model, s.gbs, model.seq_len, causal=False).total
        return 100 * flops / seconds / gpus / case.cluster.device.peak_flops(s.dtype)
    if metric == "TFLOP/s/GPU":  # Llama 3: model FLOPs (causal attention)
        return training_step_flops(model, s.gbs, model.seq_len) / seconds / gpus / 1e12
    raise ValueError(f"unknown metric {metric!r} in published_runs.csv")


@dataclass(frozen=True)
class Result:
    case: Case
    predicted: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.case.published

    @property
    def error(self) -> float:
        return abs(self.ratio - 1)


def evaluate(calibration: Calibration = CALIBRATION) -> list[Result]:
    """Predicted vs published for every row of the CSV."""
    results = []
    for row in read_rows():
        case = build_case(row)
        prediction = predict(
            case.model,
            case.cluster,
            case.strategy,
            overlap=case.overlap,
            runtime=case.runtime,
            calibration=calibration,
        )
        results.append(Result(case, metric_value(case, prediction)))
    return results


def errors_by_source(results: list[Result]) -> dict[str, tuple[float, float, int]]:
    """(mean, max) absolute relative error and row count per source table."""
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(r.case.row["source"], []).append(r.error)
    return {k: (math.fsum(v) / len(v), max(v), len(v)) for k, v in groups.items()}
