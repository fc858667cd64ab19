"""Tiny Hugging Face model folders made by ``transformers`` itself, one per family legato
reads, for the tests of ``models.hf_folder`` and the commands that take a folder.

Every parameter is drawn afresh (norm weights around 1, biases and routers nonzero), so a
weight read into the wrong place, or not read, changes the logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

_BASE = {
    "vocab_size": 258,  # the byte tokenizer's ids fit
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # most wavelengths of head_dim 16 get scaled
}
_MOE = {"num_experts_per_tok": 2}
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "llama3": ("LlamaConfig", {"rope_parameters": _LLAMA3}),
    "mistral": ("MistralConfig", {"sliding_window": 4}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", {**_MOE, "num_local_experts": 4}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {**_MOE, "num_experts": 4, "moe_intermediate_size": 32, "head_dim": 16,
         "norm_topk_prob": True, "mlp_only_layers": [0]},
    ),
}  # fmt: skip


def hf_config(family: str, **changes):
    cls, extra = FAMILIES[family]
    return getattr(transformers, cls)(**{**_BASE, **extra, **changes})


@torch.no_grad()
def random_hf_model(config, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    for name, param in model.named_parameters():
        param.normal_(0.0, 0.1)
        if "norm" in name:
            param.add_(1.0)
    return model


def save_hf_folder(family: str, folder: Path, *, max_shard_size: str = "60KB", **changes):
    """(the transformers model, its folder) for ``family``, saved in several shards."""
    model = random_hf_model(hf_config(family, **changes))
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    return model, folder
