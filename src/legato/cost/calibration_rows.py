"""The MosaicML and vTrain measurement tables as rows of ``published_runs.csv``'s columns.

Both tables report one measured run per line in their own columns; restating each line in
the published runs' schema (shape, GPU, layout, batch, metric/value) lets one case builder
(``legato.cost.published.build_case``) and one error report serve every source. Keys the
schema lacks and a source needs (MosaicML's FSDP gradient-reduce dtype) ride along.
"""

from __future__ import annotations

import csv
from importlib import resources

# MPT sizes of the llm-foundry benchmark tables: (hidden, layers, heads); MHA, GeLU MLP 4d,
# tied embeddings, vocabulary 50368 (the table's README).
MPT_SHAPES = {
    "125m": (768, 12, 12),
    "350m": (1024, 24, 16),
    "760m": (1536, 24, 12),
    "1b": (2048, 24, 16),
    "3b": (2560, 32, 20),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 48, 56),
    "70b": (8192, 80, 64),
}
MPT_VOCAB = 50368
GPT2_VOCAB = 50257  # vTrain's GPT models (Megatron pads it per tp; see published.build_case)
MOSAICML_GPUS = {"a100_40gb": "A100-SXM-40GB (RoCE)", "a100_80gb": "A100-SXM-80GB (RoCE)"}


def _table(name: str) -> list[dict[str, str]]:
    text = resources.files("legato.cost").joinpath(f"data/{name}").read_text()
    return list(csv.DictReader(text.splitlines()))


def mosaicml_rows() -> list[dict[str, str]]:
    """``mosaicml_fsdp_a100.csv``: MPT trained with PyTorch FSDP, tokens/s per GPU."""
    rows = []
    for i, r in enumerate(_table("mosaicml_fsdp_a100.csv")):
        hidden, layers, heads = MPT_SHAPES[r["model"]]
        rows.append(
            {
                "source": f"MosaicML llm-foundry, {r['section']}",
                "row_id": f"mpt-{r['model']}-{r['gpu']}-{r['n_gpus']}gpu-s{r['seq_len']}-{i}",
                "model": f"MPT-{r['model']}",
                "layers": str(layers),
                "hidden": str(hidden),
                "heads": str(heads),
                "kv_heads": "",
                "ffn": str(4 * hidden),
                "vocab": str(MPT_VOCAB),
                "seq": r["seq_len"],
                "gpu": MOSAICML_GPUS[r["gpu"]],
                "n_gpus": r["n_gpus"],
                "precision": "bf16",
                "DP": r["n_gpus"],
                "zero_or_fsdp": r["sharding_strategy"],
                "fsdp_mixed_precision": r["fsdp_mixed_precision"],
                "GBS": r["global_batch"],
                "MBS": r["micro_batch"],
                "recompute": "full" if r["activation_checkpointing"] == "True" else "none",
                "schedule": "",
                "metric": "tokens/s/GPU",
                "value": r["tokens_per_s_per_gpu"],
                "unit": "tokens/s",
            }
        )
    return rows


def vtrain_rows() -> list[dict[str, str]]:
    """``vtrain_singlenode_a100.csv``: GPT under Megatron-DeepSpeed on one A100 node,
    iteration seconds (the file's milliseconds / 1000)."""
    rows = []
    for i, r in enumerate(_table("vtrain_singlenode_a100.csv")):
        rows.append(
            {
                "source": "vTrain single-node A100 (MICRO'24)",
                "row_id": f"vtrain-{i}",
                "model": "GPT",
                "layers": r["layers"],
                "hidden": r["hidden"],
                "heads": r["heads"],
                "kv_heads": "",
                "ffn": "",
                "vocab": str(GPT2_VOCAB),
                "seq": r["seq"],
                "gpu": "A100-SXM-80GB (DGX)",
                "n_gpus": r["gpus"],
                "precision": "fp16",
                "TP": r["tp"],
                "PP": r["pp"],
                "DP": r["dp"],
                "GBS": r["gbs"],
                "MBS": r["mbs"],
                "recompute": "full",
                "schedule": "1F1B",
                "metric": "iteration time",
                "value": str(float(r["iter_ms"]) / 1000),
                "unit": "s",
            }
        )
    return rows
