"""ModelSpec: what is trained. The one description of a model every level reads.

Field names match the model-file contract of the CLI (``hidden_size``, ``num_layers``, ...),
so a user's TOML/JSON file maps onto this dataclass one to one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from legato.errors import SpecError
from legato.specs.limits import MAX_SIZE, check_at_most

MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned"]
RouterScore = Literal["softmax", "sigmoid"]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SpecError(message)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts fields. A layer is MoE when ``layer >= first_dense_layers`` and
    ``(layer - first_dense_layers) % layer_freq == 0``."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int | None = None  # default: expert_ffn_hidden_size
    first_dense_layers: int = 0
    layer_freq: int = 1
    router_score: RouterScore = "softmax"

    def __post_init__(self) -> None:
        _require(self.num_experts >= 1, f"moe.num_experts must be >= 1, got {self.num_experts}")
        check_at_most("moe.num_experts", self.num_experts, MAX_SIZE, SpecError)
        check_at_most(
            "moe.expert_ffn_hidden_size", self.expert_ffn_hidden_size, MAX_SIZE, SpecError
        )
        _require(
            1 <= self.top_k <= self.num_experts,
            f"moe.top_k must be between 1 and moe.num_experts ({self.num_experts}), got {self.top_k}",
        )
        _require(self.expert_ffn_hidden_size >= 1, "moe.expert_ffn_hidden_size must be >= 1")
        _require(self.num_shared_experts >= 0, "moe.num_shared_experts must be >= 0")
        _require(self.first_dense_layers >= 0, "moe.first_dense_layers must be >= 0")
        _require(self.layer_freq >= 1, "moe.layer_freq must be >= 1")
        if self.shared_expert_ffn_hidden_size is None:
            object.__setattr__(self, "shared_expert_ffn_hidden_size", self.expert_ffn_hidden_size)


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed Q and KV."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: Q is a full-rank projection


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (HF ``rope_type = "llama3"``): wavelengths beyond
    ``original_max_position_embeddings / low_freq_factor`` are stretched by ``factor``, those
    below ``.../ high_freq_factor`` kept, the band between interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _require(self.factor > 0, f"rope_scaling.factor must be > 0, got {self.factor}")
        _require(
            0 < self.low_freq_factor < self.high_freq_factor,
            "rope_scaling: need 0 < low_freq_factor < high_freq_factor, got "
            f"{self.low_freq_factor} and {self.high_freq_factor}",
        )
        _require(
            self.original_max_position_embeddings >= 1,
            "rope_scaling.original_max_position_embeddings must be >= 1, got "
            f"{self.original_max_position_embeddings}",
        )


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or MoE.

    ``published_params`` is the size the model's authors report (in parameters); tests
    check the exact count computed from the shape against it.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None  # default: num_heads (multi-head attention)
    ffn_hidden_size: int | None = None  # default: 4 * hidden_size
    head_dim: int | None = None  # default: hidden_size // num_heads
    mlp: MlpKind = "swiglu"
    norm: NormKind = "rmsnorm"
    position: PositionKind = "rope"
    bias: bool = False  # biases on every linear layer (GPT-2/3 style)
    qkv_bias: bool = False  # biases on the q/k/v projections only (Qwen2)
    # attend to at most this many positions, itself included (Mistral); None = all before
    sliding_window: int | None = None
    qk_norm: bool = False  # per-head RMSNorm on Q and K (Qwen3)
    tied_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # None: plain RoPE
    norm_eps: float = 1e-5
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    published_params: float | None = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_len"):
            value = getattr(self, name)
            _require(value >= 1, f"{name} must be a positive integer, got {value}")
            check_at_most(name, value, MAX_SIZE, SpecError)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.head_dim is None:
            _require(
                self.hidden_size % self.num_heads == 0,
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}), or give head_dim explicitly",
            )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require(
            1 <= self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
            f"num_kv_heads must divide num_heads ({self.num_heads}), got {self.num_kv_heads}",
        )
        _require(self.ffn_hidden_size >= 1, "ffn_hidden_size must be >= 1")
        check_at_most("ffn_hidden_size", self.ffn_hidden_size, MAX_SIZE, SpecError)
        _require(self.head_dim >= 1, "head_dim must be >= 1")
        if self.position == "rope" and self.mla is None:
            _require(self.head_dim % 2 == 0, f"rope needs an even head_dim, got {self.head_dim}")
        if self.sliding_window is not None:
            _require(
                self.sliding_window >= 1,
                f"sliding_window must be >= 1 (or unset), got {self.sliding_window}",
            )
        _require(
            not (self.qkv_bias and self.mla is not None),
            "qkv_bias: MLA has no q/k/v projections; set qkv_bias = false or drop mla",
        )
        _require(
            self.rope_scaling is None or self.position == "rope",
            f"rope_scaling needs position = 'rope', got {self.position!r}",
        )
        if self.moe is not None:
            _require(
                self.moe.first_dense_layers <= self.num_layers,
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) exceeds "
                f"num_layers ({self.num_layers})",
            )

    def is_moe_layer(self, layer: int) -> bool:
        if self.moe is None or layer < self.moe.first_dense_layers:
            return False
        return (layer - self.moe.first_dense_layers) % self.moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers ``is_moe_layer`` says are MoE, counted without walking them (the cost
        model asks for every candidate): every ``layer_freq``-th after the dense ones."""
        if self.moe is None or self.num_layers <= self.moe.first_dense_layers:
            return 0
        return -(-(self.num_layers - self.moe.first_dense_layers) // self.moe.layer_freq)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def with_(self, **changes) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)
