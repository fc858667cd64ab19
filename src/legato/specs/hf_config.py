"""Hugging Face ``config.json`` <-> ModelSpec, both directions, as plain data.

Our module names and RoPE layout are HF Llama's, so six HF families describe exactly the
specs whose computation they reproduce: Llama 2/3.x (dense; Llama 3.1's ``llama3`` RoPE
scaling), Mistral (dense with a sliding window), Qwen2 (dense, biases on q/k/v only), Qwen3
(dense with per-head ``q_norm``/``k_norm``), Mixtral (every layer MoE, optionally a window)
and Qwen3-MoE (MoE with qk-norm, or with dense layers between MoE layers). All need RMSNorm,
RoPE, SwiGLU (``hidden_act = "silu"``), no other biases, no MLA, and for MoE a softmax
router with renormalised top-k weights and no shared experts, which is what
:class:`legato.moe.Router` computes. Anything else, either way, is one ConfigError naming
the field rather than a folder or a spec that computes a different model.

Torch-free (``specs/``), so ``legato plan --model DIR`` reads a folder's spec in
milliseconds, and ``transformers`` (a dev dependency) is never imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from legato.errors import ConfigError, LegatoError
from legato.specs.model import ModelSpec, MoESpec, RopeScaling

HFStyle = Literal["qwen", "mixtral"]  # the MoE weight names (``models.hf_checkpoint``)
CONFIG_FILE = "config.json"

SUPPORTED = (
    "LlamaForCausalLM (dense), MistralForCausalLM (dense, sliding_window), "
    "Qwen2ForCausalLM (dense, qkv_bias), Qwen3ForCausalLM (dense, qk_norm), "
    "MixtralForCausalLM (MoE on every layer), Qwen3MoeForCausalLM (MoE, qk_norm or dense "
    "layers); all with RMSNorm, RoPE (default or llama3 scaling), SwiGLU, no other biases, "
    "no MLA, softmax routers and no shared experts"
)


@dataclass(frozen=True)
class _Family:
    """One HF architecture: its ``model_type``, MoE weight names, what its layers compute
    beyond Llama's, and the class defaults of the ``config.json`` keys that may be absent
    (transformers' own, per family)."""

    model_type: str
    defaults: dict[str, Any]
    hf_style: HFStyle = "qwen"
    moe: bool = False
    windowed: bool = False  # reads ``sliding_window`` (a window on every layer)
    qkv_bias: bool = False
    qk_norm: bool = False


_COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
FAMILIES = {
    "LlamaForCausalLM": _Family("llama", {**_COMMON, "num_key_value_heads": None}),
    "MistralForCausalLM": _Family(
        "mistral", {**_COMMON, "num_key_value_heads": 8, "sliding_window": 4096}, windowed=True
    ),
    "Qwen2ForCausalLM": _Family("qwen2", {**_COMMON, "num_key_value_heads": 32}, qkv_bias=True),
    "Qwen3ForCausalLM": _Family(
        "qwen3", {**_COMMON, "num_key_value_heads": 32, "head_dim": 128}, qk_norm=True
    ),
    "MixtralForCausalLM": _Family(
        "mixtral",
        {**_COMMON, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_key_value_heads": 8},
        hf_style="mixtral",
        moe=True,
        windowed=True,
    ),
    "Qwen3MoeForCausalLM": _Family(
        "qwen3_moe",
        {**_COMMON, "num_key_value_heads": 4, "decoder_sparse_step": 1, "norm_topk_prob": False},
        moe=True,
        qk_norm=True,
    ),
}


@dataclass(frozen=True)
class HfArchitecture:
    """``config`` is the ``config.json`` table; ``hf_style`` the weight names it expects."""

    name: str
    model_type: str
    hf_style: HFStyle
    config: dict[str, Any]


# --------------------------------------------------------------- config.json -> ModelSpec


def _refuse(field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{field}: {value!r} is not supported ({allowed})")


def architecture_of(config: dict[str, Any]) -> str:
    """The one supported architecture ``config`` names (``architectures``)."""
    names = config.get("architectures")
    if not isinstance(names, list) or len(names) != 1:
        raise _refuse("architectures", names, f"a list of one of: {', '.join(FAMILIES)}")
    if names[0] not in FAMILIES:
        raise _refuse("architectures", names[0], f"supported: {SUPPORTED}")
    return names[0]


def _rope(config: dict[str, Any], theta: float) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from ``rope_parameters`` (transformers >= 5) or
    ``rope_theta`` + ``rope_scaling`` (4.x)."""
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    params = config.get(key) or {}
    theta = params.get("rope_theta", config.get("rope_theta", theta))
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _refuse("partial_rotary_factor", partial, "rotary on the whole head only: 1.0")
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise _refuse(f"{key}.rope_type", kind, "supported: 'default', 'llama3'")
    try:
        scaling = RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", config["max_position_embeddings"])
            ),
        )
    except KeyError as exc:
        raise ConfigError(f"{key}: llama3 scaling needs {exc.args[0]!r}") from None
    return float(theta), scaling


def _moe(config: dict[str, Any], arch: str, layers: int) -> MoESpec:
    """The MoESpec of a Mixtral or Qwen3-MoE config; which layers are MoE must be a
    ``first_dense_layers`` + ``layer_freq`` pattern."""
    experts = config.get("num_local_experts", config.get("num_experts"))
    if arch == "MixtralForCausalLM":
        return MoESpec(experts, config["num_experts_per_tok"], config["intermediate_size"])
    if not config.get("norm_topk_prob", FAMILIES[arch].defaults["norm_topk_prob"]):
        raise _refuse("norm_topk_prob", False, "the router renormalises its top-k weights: true")
    step = config.get("decoder_sparse_step", 1)
    dense = set(config.get("mlp_only_layers") or [])
    sparse = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    if not sparse:
        raise _refuse("mlp_only_layers", sorted(dense), "at least one MoE layer")
    first = sparse[0]
    freq = sparse[1] - first if len(sparse) > 1 else 1 if first == layers - 1 else layers
    if sparse != list(range(first, layers, freq)):
        raise _refuse(
            "mlp_only_layers/decoder_sparse_step",
            [sorted(dense), step],
            "MoE layers must be every k-th layer from the first MoE one on",
        )
    return MoESpec(
        experts,
        config["num_experts_per_tok"],
        config["moe_intermediate_size"],
        first_dense_layers=first,
        layer_freq=freq,
    )


def _check_options(config: dict[str, Any], arch: str) -> None:
    """Refuse the options no legato decoder computes, naming the first one set."""
    act = config.get("hidden_act", config.get("hidden_activation", "silu"))
    if act != "silu":
        raise _refuse("hidden_act", act, "SwiGLU only: 'silu'")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag, False):
            raise _refuse(flag, True, "no biases beyond Qwen2's on q/k/v")
    if config.get("use_sliding_window", False):
        raise _refuse("use_sliding_window", True, f"{arch}'s per-layer windows: false")
    windows = [kind for kind in config.get("layer_types") or [] if kind != "full_attention"]
    if windows:
        raise _refuse("layer_types", windows[0], "every layer 'full_attention'")
    if config.get("router_jitter_noise", 0.0):
        raise _refuse("router_jitter_noise", config["router_jitter_noise"], "0.0")


def spec_from_hf_config(config: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec computing what ``config`` (a parsed ``config.json``) describes."""
    arch = architecture_of(config)
    family = FAMILIES[arch]
    _check_options(config, arch)
    merged = {**family.defaults, **config}
    try:
        layers = merged["num_hidden_layers"]
        theta, scaling = _rope(merged, merged["rope_theta"])
        return ModelSpec(
            name=name,
            hidden_size=merged["hidden_size"],
            num_layers=layers,
            num_heads=merged["num_attention_heads"],
            vocab_size=merged["vocab_size"],
            seq_len=merged["max_position_embeddings"],
            num_kv_heads=merged["num_key_value_heads"],
            ffn_hidden_size=merged["intermediate_size"],
            head_dim=merged.get("head_dim"),
            qkv_bias=family.qkv_bias,
            qk_norm=family.qk_norm,
            sliding_window=merged.get("sliding_window") if family.windowed else None,
            tied_embeddings=bool(merged["tie_word_embeddings"]),
            rope_theta=theta,
            rope_scaling=scaling,
            norm_eps=float(merged["rms_norm_eps"]),
            moe=_moe(merged, arch, layers) if family.moe else None,
            description=f"Hugging Face {arch} folder",
        )
    except KeyError as exc:
        raise ConfigError(f"{exc.args[0]}: missing ({arch} needs it)") from None


def is_hf_folder(path: str | os.PathLike) -> bool:
    """A directory with a ``config.json`` (what ``save_pretrained`` writes)."""
    return Path(path).expanduser().joinpath(CONFIG_FILE).is_file()


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's parsed ``config.json``."""
    path = Path(folder).expanduser() / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return config


def read_spec(folder: str | os.PathLike) -> ModelSpec:
    """The ModelSpec of an HF model folder, named after the folder; errors name the file."""
    folder = Path(folder).expanduser()
    config = read_config(folder)
    try:
        return spec_from_hf_config(config, folder.resolve().name)
    except LegatoError as exc:
        raise ConfigError(f"{folder / CONFIG_FILE}: {exc}") from None


# --------------------------------------------------------------- ModelSpec -> config.json


def _unsupported(spec: ModelSpec) -> str | None:
    """What in ``spec`` no supported HF family computes, or None."""
    checks = {
        f"mlp = {spec.mlp!r}": spec.mlp != "swiglu",
        f"norm = {spec.norm!r}": spec.norm != "rmsnorm",
        f"position = {spec.position!r}": spec.position != "rope",
        "bias = true": spec.bias,
        "mla": spec.mla is not None,
        "qkv_bias with qk_norm, moe or sliding_window": spec.qkv_bias
        and (spec.qk_norm or spec.moe is not None or spec.sliding_window is not None),
        "sliding_window with qk_norm": spec.sliding_window is not None and spec.qk_norm,
    }
    if spec.moe is not None:
        checks[f"moe.router_score = {spec.moe.router_score!r}"] = spec.moe.router_score != "softmax"
        checks["moe.num_shared_experts > 0"] = spec.moe.num_shared_experts > 0
    return next((what for what, bad in checks.items() if bad), None)


def _rope_config(spec: ModelSpec) -> dict[str, Any]:
    """RoPE keys: ``rope_parameters`` for transformers >= 5, ``rope_theta`` (and
    ``rope_scaling``) for 4.x."""
    scaling = spec.rope_scaling
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    out: dict[str, Any] = {"rope_theta": spec.rope_theta, "rope_parameters": params}
    if scaling is not None:
        llama3 = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
        params.update(llama3)
        out["rope_scaling"] = llama3
    return out


def _family_of(spec: ModelSpec) -> str:
    moe = spec.moe
    if moe is None:
        if spec.qk_norm:
            return "Qwen3ForCausalLM"
        if spec.qkv_bias:
            return "Qwen2ForCausalLM"
        return "LlamaForCausalLM" if spec.sliding_window is None else "MistralForCausalLM"
    if not spec.qk_norm and spec.num_moe_layers == spec.num_layers:
        return "MixtralForCausalLM"
    if spec.qk_norm and spec.sliding_window is None:
        return "Qwen3MoeForCausalLM"
    raise ConfigError(
        f"model {spec.name!r}: MoE with dense layers maps onto Qwen3MoeForCausalLM, which "
        f"has qk_norm and no sliding window; this model has qk_norm = {str(spec.qk_norm).lower()}; "
        f"supported: {SUPPORTED}"
    )


def _family_keys(spec: ModelSpec, name: str) -> dict[str, Any]:
    """The keys only ``name``'s family reads."""
    moe = spec.moe
    if name == "LlamaForCausalLM":
        return {"attention_bias": False, "mlp_bias": False}
    if name == "MistralForCausalLM":
        return {"sliding_window": spec.sliding_window}
    if name in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return {"attention_bias": False, "use_sliding_window": False}
    if name == "MixtralForCausalLM":
        return {
            "intermediate_size": moe.expert_ffn_hidden_size,
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "router_jitter_noise": 0.0,
            "sliding_window": spec.sliding_window,
        }
    return {
        "attention_bias": False,
        "moe_intermediate_size": moe.expert_ffn_hidden_size,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(spec.num_layers) if not spec.is_moe_layer(i)],
        "use_sliding_window": False,
    }


def hf_architecture(spec: ModelSpec) -> HfArchitecture:
    """The HF family computing ``spec``'s forward, with its config; a ConfigError if none."""
    reason = _unsupported(spec)
    if reason is not None:
        raise ConfigError(
            f"model {spec.name!r}: no Hugging Face architecture computes it ({reason}); "
            f"supported: {SUPPORTED}"
        )
    name = _family_of(spec)
    family = FAMILIES[name]
    config: dict[str, Any] = {
        "architectures": [name],
        "model_type": family.model_type,
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
        "attention_dropout": 0.0,
        **_rope_config(spec),
        **_family_keys(spec, name),
    }
    return HfArchitecture(name, family.model_type, family.hf_style, config)
