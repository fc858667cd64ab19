"""The Hugging Face architecture of a ModelSpec, as the ``config.json`` ``transformers`` reads.

Our module names and RoPE layout are HF Llama's, so four HF families describe the specs
whose computation they reproduce exactly: Llama (dense), Qwen3 (dense with per-head
``q_norm``/``k_norm``), Mixtral (every layer MoE) and Qwen3-MoE (MoE with qk-norm, or with
dense layers between MoE layers). All four need RMSNorm, RoPE, SwiGLU, no biases, no MLA,
and for MoE a softmax router with renormalised top-k weights and no shared experts, which
is what :class:`legato.moe.Router` computes. Anything else is refused in one line rather
than written as a folder that loads into a different model. The dict is built without
importing ``transformers`` (a dev dependency), so exporting does not need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from legato.errors import ConfigError
from legato.models.hf_checkpoint import HFStyle
from legato.specs.model import ModelSpec

SUPPORTED = (
    "LlamaForCausalLM (dense), Qwen3ForCausalLM (dense, qk_norm), MixtralForCausalLM (MoE "
    "on every layer), Qwen3MoeForCausalLM (MoE, qk_norm or dense layers); all with "
    "RMSNorm, RoPE, SwiGLU, no biases, no MLA, softmax routers and no shared experts"
)


@dataclass(frozen=True)
class HfArchitecture:
    """``config`` is the ``config.json`` table; ``hf_style`` the weight names it expects."""

    name: str
    model_type: str
    hf_style: HFStyle
    config: dict[str, Any]


def _unsupported(spec: ModelSpec) -> str | None:
    """What in ``spec`` no supported HF family computes, or None."""
    checks = {
        f"mlp = {spec.mlp!r}": spec.mlp != "swiglu",
        f"norm = {spec.norm!r}": spec.norm != "rmsnorm",
        f"position = {spec.position!r}": spec.position != "rope",
        "bias = true": spec.bias,
        "mla": spec.mla is not None,
    }
    if spec.moe is not None:
        checks[f"moe.router_score = {spec.moe.router_score!r}"] = spec.moe.router_score != "softmax"
        checks["moe.num_shared_experts > 0"] = spec.moe.num_shared_experts > 0
    return next((what for what, bad in checks.items() if bad), None)


def hf_architecture(spec: ModelSpec) -> HfArchitecture:
    """The HF family computing ``spec``'s forward, with its config; a ConfigError if none."""
    reason = _unsupported(spec)
    if reason is not None:
        raise ConfigError(
            f"model {spec.name!r}: no Hugging Face architecture computes it ({reason}); "
            f"supported: {SUPPORTED}"
        )
    config: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "tie_word_embeddings": spec.tied_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        # transformers >= 5 reads rope_parameters, 4.x reads rope_theta
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
    }
    moe = spec.moe
    if moe is None and not spec.qk_norm:
        name, model_type, style = "LlamaForCausalLM", "llama", "qwen"
        config["mlp_bias"] = False
    elif moe is None:
        name, model_type, style = "Qwen3ForCausalLM", "qwen3", "qwen"
        config["use_sliding_window"] = False
    elif not spec.qk_norm and spec.num_moe_layers == spec.num_layers:
        name, model_type, style = "MixtralForCausalLM", "mixtral", "mixtral"
        config.update(
            intermediate_size=moe.expert_ffn_hidden_size,
            num_local_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            router_jitter_noise=0.0,
            sliding_window=None,
        )
    elif spec.qk_norm:
        name, model_type, style = "Qwen3MoeForCausalLM", "qwen3_moe", "qwen"
        config.update(
            moe_intermediate_size=moe.expert_ffn_hidden_size,
            num_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[i for i in range(spec.num_layers) if not spec.is_moe_layer(i)],
            use_sliding_window=False,
        )
    else:
        raise ConfigError(
            f"model {spec.name!r}: MoE with dense layers maps onto Qwen3MoeForCausalLM, which "
            f"has qk_norm; this model has qk_norm = false; supported: {SUPPORTED}"
        )
    return HfArchitecture(
        name, model_type, style, {"architectures": [name], "model_type": model_type, **config}
    )
