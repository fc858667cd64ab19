"""The op graph of a transformer: which tensors each op reads, holds and writes, and how
big they are. Placements are assigned separately (``layout.roles``), per mesh axis.

Activations are ``[batch, seq, features]`` (dims 0, 1, 2); the routed-token buffers of an
MoE layer are ``[experts, capacity, features]``. Weights use torch's ``nn.Linear`` layout
``[out, in]`` and the Hugging Face names of ``legato.models``, so the runtime can look them
up in a reference block. Sizes are *logical*: one micro-batch of every data-parallel
replica, ``mbs * dp`` sequences, before any sharding. MLA attention is counted with the
per-head shapes after its latent up-projections (the q/k/v each head sees); all of its
input-side weights are lumped into ``q_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.specs.model import ModelSpec
from legato.specs.params import attention_params

STATS_BYTES = 4  # norm and loss statistics, router logits: fp32
NO_GRADIENT = frozenset({"ids"})  # integer token ids: nothing flows back to them


@dataclass(frozen=True)
class Op:
    """One op: ``kind`` selects its placement rule; tensors by name."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    weights: tuple[str, ...]
    outputs: tuple[str, ...]


def _op(name: str, kind: str, inputs: str, weights: str, outputs: str) -> Op:
    return Op(name, kind, tuple(inputs.split()), tuple(weights.split()), tuple(outputs.split()))


def _norm(prefix: str, x: str, weight: str, out: str) -> list[Op]:
    """RMS statistics, then scaling: split so a hidden-sharded input shows its reduction."""
    return [
        _op(f"{prefix}.stats", "norm.stats", x, "", f"{prefix}_rms"),
        _op(prefix, "norm", f"{x} {prefix}_rms", weight, out),
    ]


def attention_ops() -> list[Op]:
    return [
        *_norm("attn_norm", "x", "input_layernorm.weight", "xn"),
        _op(
            "qkv",
            "qkv",
            "xn",
            "self_attn.q_proj.weight self_attn.k_proj.weight self_attn.v_proj.weight",
            "q k v",
        ),
        _op("attn_core", "attn_core", "q k v", "", "o"),
        _op("o_proj", "o_proj", "o", "self_attn.o_proj.weight", "attn_out"),
        _op("attn_residual", "residual", "x attn_out", "", "x2"),
    ]


def mlp_ops(swiglu: bool) -> list[Op]:
    gate = "mlp.gate_proj.weight " if swiglu else ""
    return [
        *_norm("mlp_norm", "x2", "post_attention_layernorm.weight", "x2n"),
        _op("mlp_up", "mlp_up", "x2n", f"{gate}mlp.up_proj.weight", "g u" if swiglu else "u"),
        _op("mlp_act", "mlp_act", "g u" if swiglu else "u", "", "hh"),
        _op("mlp_down", "mlp_down", "hh", "mlp.down_proj.weight", "mlp_out"),
        _op("mlp_residual", "residual", "x2 mlp_out", "", "y"),
    ]


def moe_ops(swiglu: bool, shared: bool) -> list[Op]:
    gate, shared_gate = ("mlp.experts.gate_proj ", "mlp.shared_experts.gate_proj.weight ")
    if not swiglu:
        gate = shared_gate = ""
    ops = [
        *_norm("mlp_norm", "x2", "post_attention_layernorm.weight", "x2n"),
        _op("router", "router", "x2n", "mlp.gate.weight", "logits"),
        _op("dispatch", "dispatch", "x2n logits", "", "routed"),
        _op(
            "experts_up",
            "experts_up",
            "routed",
            f"{gate}mlp.experts.up_proj",
            "eg eu" if swiglu else "eu",
        ),
        _op("experts_act", "experts_act", "eg eu" if swiglu else "eu", "", "eh"),
        _op("experts_down", "experts_down", "eh", "mlp.experts.down_proj", "ed"),
    ]
    if shared:
        ops += [
            _op(
                "shared_up",
                "mlp_up",
                "x2n",
                f"{shared_gate}mlp.shared_experts.up_proj.weight",
                "sg su" if swiglu else "su",
            ),
            _op("shared_act", "mlp_act", "sg su" if swiglu else "su", "", "sh"),
            _op("shared_down", "mlp_down", "sh", "mlp.shared_experts.down_proj.weight", "sd"),
        ]
    ops += [
        _op("combine", "combine", "ed logits", "", "moe_out"),
        _op("mlp_residual", "residual", f"x2 moe_out{' sd' if shared else ''}", "", "y"),
    ]
    return ops


def embedding_ops() -> list[Op]:
    return [
        _op("embedding", "embedding", "ids", "model.embed_tokens.weight", "emb"),
        _op("embed_out", "residual", "emb", "", "x"),
    ]


def head_ops(tied: bool) -> list[Op]:
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    return [
        *_norm("final_norm", "y", "model.norm.weight", "yn"),
        _op("lm_head", "lm_head", "yn", head, "vocab_logits"),
        _op("loss.stats", "loss.stats", "vocab_logits", "", "loss_max loss_sumexp loss_target"),
        _op("loss", "loss", "loss_max loss_sumexp loss_target", "", "loss"),
    ]


@dataclass(frozen=True)
class Sizes:
    """Logical bytes of every activation and element counts of every weight of one
    micro-batch (``sequences`` = mbs * dp sequences of ``seq_len`` tokens)."""

    activation_bytes: dict[str, float]
    weight_numel: dict[str, int]


def _head_dims(spec: ModelSpec) -> tuple[int, int, int]:
    """(kv heads, q/k head dim, v head dim) as the attention core sees them."""
    if spec.mla is None:
        return spec.num_kv_heads, spec.head_dim, spec.head_dim
    mla = spec.mla
    return spec.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim


def sizes(spec: ModelSpec, sequences: int, act_bytes: int) -> Sizes:
    tokens = sequences * spec.seq_len
    h, a, f, vocab = spec.hidden_size, spec.num_heads, spec.ffn_hidden_size, spec.vocab_size
    kv, dq, dv = _head_dims(spec)
    features = {"x": h, "xn": h, "q": a * dq, "k": kv * dq, "v": kv * dv, "o": a * dv}
    features |= {"attn_out": h, "x2": h, "x2n": h, "g": f, "u": f, "hh": f, "mlp_out": h}
    features |= {"y": h, "emb": h, "yn": h, "vocab_logits": vocab}
    fp32 = ["attn_norm_rms", "mlp_norm_rms", "final_norm_rms", "loss_max", "loss_sumexp"]
    fp32 += ["loss_target", "loss"]
    out = {name: tokens * n * act_bytes for name, n in features.items()}
    out |= {name: tokens * STATS_BYTES for name in fp32}
    out["ids"] = tokens * 8
    weights = {"input_layernorm.weight": h, "post_attention_layernorm.weight": h}
    weights |= {"self_attn.o_proj.weight": h * a * dv, "model.norm.weight": h}
    if spec.mla is None:
        weights |= {"self_attn.q_proj.weight": a * dq * h, "self_attn.v_proj.weight": kv * dv * h}
        weights["self_attn.k_proj.weight"] = kv * dq * h
    else:  # MLA: every input-side projection, latent ones included, lumped into q
        in_proj = attention_params(spec.with_(bias=False))[0] - h * a * dv
        weights |= {"self_attn.q_proj.weight": in_proj, "self_attn.k_proj.weight": 0}
        weights["self_attn.v_proj.weight"] = 0
    for name in ("gate_proj", "up_proj", "down_proj"):
        weights[f"mlp.{name}.weight"] = h * f
    weights["model.embed_tokens.weight"] = weights["lm_head.weight"] = vocab * h
    moe = spec.moe
    if moe is not None:
        k, fe = moe.top_k, moe.expert_ffn_hidden_size
        fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        out |= {name: tokens * k * h * act_bytes for name in ("routed", "ed")}
        out |= {name: tokens * k * fe * act_bytes for name in ("eg", "eu", "eh")}
        out |= {name: tokens * fs * act_bytes for name in ("sg", "su", "sh")}
        out |= {"sd": tokens * h * act_bytes, "moe_out": tokens * h * act_bytes}
        out["logits"] = tokens * moe.num_experts * STATS_BYTES
        weights["mlp.gate.weight"] = moe.num_experts * h
        for name in ("gate_proj", "up_proj", "down_proj"):
            weights[f"mlp.experts.{name}"] = moe.num_experts * fe * h
            weights[f"mlp.shared_experts.{name}.weight"] = fs * h
    return Sizes(out, weights)
