"""The same base model as a Hugging Face ``LlamaForCausalLM``, for PEFT interop and baselines.

Our reference model uses HF Llama's module names and RoPE layout, so a Llama-style spec maps
onto a ``LlamaConfig`` field by field and ``to_hf_state_dict`` loads into it unchanged.
``transformers`` is imported only when these functions are called (a dev dependency).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from legato.errors import ConfigError
from legato.models.hf_checkpoint import to_hf_state_dict
from legato.models.transformer import Transformer
from legato.specs.model import ModelSpec

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM


def llama_config(spec: ModelSpec) -> LlamaConfig:
    """A ``LlamaConfig`` for a Llama-style spec (RMSNorm, RoPE, SwiGLU, no biases, dense)."""
    from transformers import LlamaConfig

    unsupported = {
        "mlp": spec.mlp != "swiglu",
        "norm": spec.norm != "rmsnorm",
        "position": spec.position != "rope",
        "bias": spec.bias,
        "qk_norm": spec.qk_norm,
        "moe": spec.moe is not None,
        "mla": spec.mla is not None,
    }
    bad = [name for name, is_bad in unsupported.items() if is_bad]
    if bad:
        raise ConfigError(f"model {spec.name!r}: not a Llama architecture ({bad[0]} differs)")
    fields = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tied_embeddings,
    }
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    else:  # transformers 4.x
        fields["rope_theta"] = spec.rope_theta
    return LlamaConfig(**fields)


def to_hf_llama(model: Transformer) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` holding a copy of ``model``'s weights (same device and dtype)."""
    from transformers import LlamaForCausalLM

    weight = model.output_weight()
    hf = LlamaForCausalLM(llama_config(model.spec)).to(device=weight.device, dtype=weight.dtype)
    hf.load_state_dict(to_hf_state_dict(model), strict=True)
    return hf.eval()
