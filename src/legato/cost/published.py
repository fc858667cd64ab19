"""Published training runs as (model, cluster, strategy) triples, and the cost model's error.

Each row of ``data/published_runs.csv`` and of the MosaicML and vTrain tables (restated
in its columns by ``legato.cost.calibration_rows``) becomes a ModelSpec (from its shape
columns, or the preset of its model name when they are empty), a ClusterSpec (the DGX
preset of its GPU, or the source's RoCE cluster) and a Strategy (its layout columns); gaps are filled the way the source describes
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
from legato.cost.calibration_rows import mosaicml_rows, vtrain_rows
from legato.cost.flops import forward_flops, training_step_flops
from legato.cost.prediction import Prediction
from legato.cost.runtime import Runtime, parse_runtime
from legato.cost.training_step import predict
from legato.errors import LegatoError
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
    "Llama3": "the embedding and the head count as layers of the pipeline split (the paper "
    "drops one layer from the first and last stage, which hold them: Megatron's "
    "embedding_stage and loss_stage); FSDP that keeps weights gathered through the step = "
    "ZeRO-2; SP on; interleaved with 8 one-layer chunks per device (126 layers + embedding + "
    "head fill 16 x 8 chunks, the first holding only the embedding); MBS 1; recompute not reported and the paper "
    "saves memory by stage balancing instead: none; RoCE 400 Gb/s per GPU between nodes",
    "torchtitan": "FSDP2 full shard = ZeRO-3 under the torchtitan runtime profile (fp32 "
    "gradient reduction, eager elementwise ops: torch.compile was off by default); "
    "'selective op' = torchtitan's op-level policy (every other matmul output kept), "
    "'selective layer' = its layer-level policy (every second block checkpointed); fused "
    "attention; DGX A100 network",
    "MosaicML": "FSDP FULL_SHARD = ZeRO-3 (weights re-gathered every micro-batch) under the "
    "fsdp1 runtime profile; "
    "mixed precision DEFAULT reduces gradients and computes the loss in fp32, PURE in "
    "bf16; fused (flash) attention, no dropout; activation checkpointing = full "
    "recompute; MPT as GPT (GeLU MLP 4d, LayerNorm, tied embeddings); 8 GPUs per node, "
    "RoCE 1600 Gb/s per node",
    "vTrain": "Megatron-DeepSpeed: materialised attention with dropout, no SP, plain 1F1B, "
    "gradients all-reduced after the backward; vocabulary 50257 padded to a multiple of "
    "128 x tp; the GPUs used are one DGX A100 node's first 2, 4 or 8",
}

H100_ROCE = {
    "name": "dgx-h100-roce",
    "device": "h100",
    "devices_per_node": 8,
    "intra_node": {"name": "NVLink 4", "bandwidth_gbps": 450, "latency_us": 2.0},
    "inter_node": {"name": "RoCE 400 Gb/s per GPU", "bandwidth_gbps": 50, "latency_us": 8.0},
}
A100_ROCE = {  # MosaicML's benchmark clusters
    "name": "a100-roce",
    "devices_per_node": 8,
    "intra_node": {"name": "NVLink 3", "bandwidth_gbps": 300, "latency_us": 2.0},
    "inter_node": {"name": "RoCE 200 Gb/s per GPU", "bandwidth_gbps": 25, "latency_us": 8.0},
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
    """Every calibration row: the published runs, then MosaicML's, then vTrain's."""
    text = resources.files("legato.cost").joinpath("data/published_runs.csv").read_text()
    return [*csv.DictReader(text.splitlines()), *mosaicml_rows(), *vtrain_rows()]


def _int(row: dict[str, str], key: str, default: int = 1) -> int:
    value = row.get(key, "").strip()
    return int(value) if value else default


FAMILIES = (  # source column prefix -> key of ASSUMPTIONS
    ("Narayanan2021", "Narayanan2021"),
    ("Korthikanti2022", "Korthikanti2022"),
    ("Smith2022", "Smith2022"),
    ("Llama3", "Llama3"),
    ("pytorch/torchtitan", "torchtitan"),
    ("MosaicML", "MosaicML"),
    ("vTrain", "vTrain"),
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
    gpus = _int(row, "n_gpus")
    nodes, per_node = (gpus // 8, 8) if gpus >= 8 else (1, gpus)
    if row["gpu"].startswith("H100"):
        return load_cluster({**H100_ROCE, "nodes": nodes}, devices_per_node=per_node)
    if row["gpu"].endswith("(RoCE)"):
        device = "a100-40g" if "40GB" in row["gpu"] else "a100-80g"
        return load_cluster(
            {**A100_ROCE, "device": device, "nodes": nodes}, devices_per_node=per_node
        )
    return load_cluster("dgx-a100", nodes=nodes, devices_per_node=per_node)


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
        runtime, overlap = Runtime(), True
        fields.update(sp=True, zero=2, vpp=8, embedding_stage=True, loss_stage=True)
    elif family == "torchtitan":
        policy = {"selective op": "ops", "selective layer": "blocks"}.get(recompute, "attention")
        runtime = parse_runtime({"profile": "torchtitan", "selective": policy})
        overlap = True
        fields["zero"] = 3
    elif family == "MosaicML":  # DEFAULT: fp32 reductions and loss; PURE: both in bf16
        reduced = 4 if row["fsdp_mixed_precision"] == "DEFAULT" else 2
        runtime = parse_runtime(
            {"profile": "fsdp1", "grad_reduce_bytes": reduced, "loss_bytes": reduced}
        )
        overlap = True
        fields["zero"] = 3
    elif family == "vTrain":  # Megatron pads the vocabulary to a multiple of 128 x tp
        multiple = 128 * fields["tp"]
        model = model.with_(vocab_size=-(-model.vocab_size // multiple) * multiple)
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
    """One case's prediction: ``predicted`` in the row's metric, ``step_s`` the step."""

    case: Case
    predicted: float
    step_s: float
    fits: bool

    @property
    def ratio(self) -> float:
        return self.predicted / self.case.published

    @property
    def error(self) -> float:
        return abs(self.ratio - 1)

    @property
    def measured_tokens_per_s(self) -> float:
        """The published run's throughput: its step time, or (for a rate metric, which
        scales as one over the step) the predicted step scaled by the ratio."""
        tokens = self.case.strategy.gbs * self.case.counted.seq_len
        if self.case.row["metric"] == "iteration time":
            return tokens / self.case.published
        return tokens / (self.step_s * self.ratio)

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.case.strategy.gbs * self.case.counted.seq_len / self.step_s


@dataclass(frozen=True)
class Rejected:
    """A row the cost model refused, and its one-line reason."""

    row: dict[str, str]
    reason: str


def load_cases() -> tuple[list[Case], list[Rejected]]:
    """Every row of ``read_rows()`` as a Case that ``predict`` accepts; the rows it refuses
    are returned with the reason instead of stopping the others."""
    cases, rejected = [], []
    for row in read_rows():
        try:
            case = build_case(row)
            case.strategy.check(case.model, case.cluster.world_size)
        except LegatoError as exc:
            rejected.append(Rejected(row, str(exc)))
        else:
            cases.append(case)
    return cases, rejected


def evaluate(
    calibration: Calibration = CALIBRATION, cases: list[Case] | None = None
) -> list[Result]:
    """Predicted vs published for ``cases`` (default: every row ``load_cases`` accepts)."""
    results = []
    for case in load_cases()[0] if cases is None else cases:
        prediction = predict(
            case.model,
            case.cluster,
            case.strategy,
            overlap=case.overlap,
            runtime=case.runtime,
            calibration=calibration,
        )
        results.append(
            Result(case, metric_value(case, prediction), prediction.step_time_s, prediction.fits)
        )
    return results


def errors_by_source(results: list[Result]) -> dict[str, tuple[float, float, int]]:
    """(mean, max) absolute relative error and row count per source table."""
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(r.case.row["source"], []).append(r.error)
    return {k: (math.fsum(v) / len(v), max(v), len(v)) for k, v in groups.items()}
