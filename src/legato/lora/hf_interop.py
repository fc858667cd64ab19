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
from legato.specs.hf_config import hf_architecture
from legato.specs.model import ModelSpec

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM


def llama_config(spec: ModelSpec) -> LlamaConfig:
    """A ``LlamaConfig`` for a Llama-style spec (RMSNorm, RoPE, SwiGLU, no biases, dense)."""
    from transformers import LlamaConfig

    arch = hf_architecture(spec)
    if arch.name != "LlamaForCausalLM":
        raise ConfigError(f"model {spec.name!r}: not a Llama architecture (it is {arch.name})")
    fields = {k: v for k, v in arch.config.items() if k not in ("architectures", "model_type")}
    if "rope_parameters" not in inspect.signature(LlamaConfig.__init__).parameters:
        del fields["rope_parameters"]  # transformers 4.x
    return LlamaConfig(**fields)


def to_hf_llama(model: Transformer) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` holding a copy of ``model``'s weights (same device and dtype)."""
    from transformers import LlamaForCausalLM

    weight = model.output_weight()
    hf = LlamaForCausalLM(llama_config(model.spec)).to(device=weight.device, dtype=weight.dtype)
    hf.load_state_dict(to_hf_state_dict(model), strict=True)
    return hf.eval()
