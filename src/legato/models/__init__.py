"""Reference decoder transformer built from a ModelSpec, with Hugging Face names."""

from legato.models.hf_checkpoint import (
    load_hf_state_dict,
    load_safetensors,
    save_safetensors,
    to_hf_state_dict,
)
from legato.models.moe import MoE
from legato.models.transformer import Block, Transformer, build_model

__all__ = [
    "Block",
    "MoE",
    "Transformer",
    "build_model",
    "load_hf_state_dict",
    "load_safetensors",
    "save_safetensors",
    "to_hf_state_dict",
]
