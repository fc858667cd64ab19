"""Peak memory of one device: model states, activations and buffers.

Model states (bytes per parameter): mixed precision Adam keeps low-precision weights and
gradients (2 + 2) plus an fp32 master copy and two fp32 moments (12), 16 in all; fp32
training keeps 4 + 4 + 8. ZeRO-1 shards the optimizer states over the ranks that hold the
same weights (dp x cp; dp x cp / ep for experts), ZeRO-2 also the gradients, ZeRO-3/FSDP
also the weights. TP splits every block matrix (norms are negligible), PP the layers, EP
the experts, expert-TP each expert.

Activations per block and micro-batch generalise Korthikanti et al. (``s b h (34 + 5 a
s / h)`` bytes for a GPT layer in fp16 with dropout): with ``d`` bytes per element, ``t``
tensor-parallel ranks and ``T = b s / cp`` tokens, a block stores

* replicated unless sequence parallel (then ``/t``): both norm inputs and both norm
  outputs (the inputs of QKV and of the MLP), ``4 d T h``, plus the two dropout masks;
* split by ``t``: Q, K, V (GQA: K and V have ``kv_heads``) and the attention output,
  ``d T (heads + kv) head_dim + ...``; the MLP's activation-function input and output
  (GeLU ``2 d T f``; SwiGLU gate, up and product, ``3 d T f``); for MoE each routed
  token's copy and its expert activations (``top_k`` per token) plus the shared experts;
* materialised attention only (no fused kernel): softmax output, its dropout mask and
  output, ``(d + 1 + d) b heads s^2 / t`` (Korthikanti's ``5 a s^2 b``); a fused kernel
  stores only the fp32 softmax statistics.

For a GPT layer in fp16 with dropout this is exactly Korthikanti's formula (34 = 10 + 24).
Selective recompute drops the ``s^2`` terms (Megatron's core-attention recompute; other
frameworks mean other things by "selective", ``Runtime.selective``: torchtitan's
op-level policy keeps only the block input, every other matmul's output and the attention
output, its layer-level policy checkpoints every second block whole); full recompute keeps only each block's input
(``d T h``, ``/t`` with sequence parallelism) plus one block's full set while it is
recomputed. Times the micro-batches in flight on the device (``cost.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.layer import head_dims
from legato.cost.runtime import DTYPE_BYTES, Runtime, activation_bytes
from legato.specs.dtypes import DTYPE_KINDS
from legato.specs.model import ModelSpec
from legato.specs.params import layer_params, mlp_params
from legato.specs.strategy import Strategy

GIB = 2**30
TERMS = ("params", "grads", "optimizer", "activations", "buffers")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer states."""

    weights: int
    grads: int
    optimizer: int


def state_bytes(dtype: str) -> StateBytes:
    """16 bytes per parameter either way: 2 + 2 + (4 master + 4 + 4 moments) in mixed
    precision, 4 + 4 + (4 + 4 moments) in fp32. fp8 training keeps bf16 weights."""
    if dtype == "fp32":
        return StateBytes(4, 4, 8)
    return StateBytes(2, 2, 12)


@dataclass(frozen=True)
class DeviceParams:
    """Parameters one device holds (after TP/PP/EP, before ZeRO): ``dense`` are reduced
    over dp x cp, ``experts`` over ``strategy.expert_dp`` ranks (dp x cp / ep)."""

    dense: float
    experts: float

    @property
    def total(self) -> float:
        return self.dense + self.experts

    def sharded(self, strategy: Strategy) -> float:
        """This device's share when sharded over the ranks holding the same weights."""
        return self.dense / (strategy.dp * strategy.cp) + self.experts / strategy.expert_dp


def block_params(model: ModelSpec, layer: int, strategy: Strategy) -> DeviceParams:
    """One block's parameters on one device."""
    total = layer_params(model, layer)
    experts = 0
    if model.is_moe_layer(layer):
        experts = model.moe.num_experts * mlp_params(model, model.moe.expert_ffn_hidden_size)
    return DeviceParams((total - experts) / strategy.tp, experts / (strategy.ep * strategy.etp))


def edge_params(model: ModelSpec, strategy: Strategy, first: bool, last: bool) -> float:
    """Embedding (first stage), final norm and LM head (last stage) on one device. With
    tied embeddings and ``pp > 1`` the last stage keeps its own copy of the embedding."""
    h = model.hidden_size
    table = model.vocab_size * h / strategy.tp
    n = 0.0
    if first:
        n += table + (model.seq_len * h if model.position == "learned" else 0)
    if last:
        n += 2 * h if model.norm == "layernorm" else h
        if not model.tied_embeddings or not first:
            n += table
    return n


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes one block stores for one micro-batch, by recompute mode (``ops``: torchtitan's
    op-level selective policy)."""

    none: float
    selective: float
    full: float
    ops: float

    def stored(self, recompute: str, selective: str = "attention") -> float:
        """Kept bytes under ``recompute`` and, for ``selective``, the runtime's policy
        (``blocks``: every second block kept whole, the others as their input)."""
        if recompute != "selective":
            return getattr(self, recompute)
        if selective == "blocks":
            return (self.none + self.full) / 2
        return self.ops if selective == "ops" else self.selective


def _block_linears(model: ModelSpec, is_moe: bool) -> list[tuple[float, float, bool]]:
    """(output width, input width, column-parallel) of a block's matmuls in the order
    torchtitan's Llama block runs them: wq, wk, wv, wo, then w1, w3, w2 (GeLU: up,
    down); an MoE block's experts are not matmuls that policy counts."""
    h, heads, kv = model.hidden_size, model.num_heads, model.num_kv_heads
    qk, v = head_dims(model)
    attention = [
        (heads * qk, h, True),
        (kv * qk, h, True),
        (kv * v, h, True),
        (h, heads * v, False),
    ]
    if is_moe:
        return attention
    f = model.ffn_hidden_size
    gated = [(f, h, True)] * (2 if model.mlp == "swiglu" else 1)
    return [*attention, *gated, (h, f, False)]


def ops_recompute_share(model: ModelSpec, is_moe: bool) -> float:
    """Share of a block's matmul FLOPs that torchtitan's op-level policy recomputes: every
    second matmul (torchtitan activation_checkpoint: '# Only save every other mm')."""
    linears = _block_linears(model, is_moe)
    flops = [out * inp for out, inp, _ in linears]
    return sum(flops[1::2]) / sum(flops)


def block_activations(
    model: ModelSpec, is_moe: bool, strategy: Strategy, runtime: Runtime
) -> ActivationBytes:
    """Generalised Korthikanti activation bytes of one block (see the module docstring)."""
    s, b, t, c = model.seq_len, strategy.mbs, strategy.tp, strategy.cp
    h, d = model.hidden_size, activation_bytes(strategy.dtype)
    tokens = b * s / c
    mask = 1 if runtime.dropout else 0
    sp_div = t if strategy.sp else 1
    heads, kv = model.num_heads, model.num_kv_heads
    qk, v = head_dims(model)
    replicated = (4 * d + 2 * mask) * tokens * h / sp_div
    attention = d * tokens * (heads * qk + kv * qk + kv * v + heads * v) / t
    act = 3 if model.mlp == "swiglu" else 2
    if is_moe:
        moe = model.moe
        routed = tokens * moe.top_k / t
        mlp = routed * d * (h + act * moe.expert_ffn_hidden_size)
        mlp += 2 * 4 * tokens * moe.num_experts / t  # router logits and probabilities
        f_s = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        mlp += act * d * tokens * f_s / t
    else:
        mlp = act * d * tokens * model.ffn_hidden_size / t
    kept = replicated + attention + mlp
    if runtime.flash_attention or c > 1:
        scores = 4 * tokens * heads / t  # fp32 log-sum-exp per query and head
        selective = kept + scores
    else:
        scores = (d + mask * (1 + d)) * b * heads / t * s * s
        selective = kept
    block_input = d * tokens * h / sp_div
    # op-level policy: the input, every other matmul's output and the attention output
    # with its statistics (torchtitan _save_list: mm, SDPA); an MoE block's routed part
    # is kept as Korthikanti's
    saved = sum(
        out / (t if column else sp_div) for out, _, column in _block_linears(model, is_moe)[::2]
    )
    ops = block_input + d * tokens * saved + d * tokens * heads * v / t + 4 * tokens * heads / t
    if is_moe:
        ops += mlp
    return ActivationBytes(none=kept + scores, selective=selective, full=block_input, ops=ops)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes of one device by term, the stage it belongs to, and what it parks in
    host memory."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    stage: int
    host: float = 0.0  # activations swapped to host memory (not in ``total``)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def gib(self) -> dict[str, float]:
        return {term: getattr(self, term) / GIB for term in TERMS}


def model_states(held: DeviceParams, strategy: Strategy) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes after ZeRO sharding over the replica ranks."""
    per = state_bytes(strategy.dtype)
    shard = held.sharded(strategy)

    def stored(stage: int) -> float:  # ZeRO-``stage`` and above shard this term
        return shard if strategy.zero >= stage else held.total

    return per.weights * stored(3), per.grads * stored(2), per.optimizer * stored(1)


def logits_bytes(model: ModelSpec, strategy: Strategy, loss_bytes: int = 4) -> float:
    """Logits of one micro-batch on the last stage, in the training dtype and in the
    loss's working copy (fp32 unless ``Runtime.loss_bytes`` says otherwise)."""
    tokens = strategy.mbs * model.seq_len / strategy.cp
    d = activation_bytes(strategy.dtype)
    return (loss_bytes + d) * tokens * model.vocab_size / strategy.tp


def comm_buffer_bytes(largest_block: DeviceParams, model: ModelSpec, strategy: Strategy) -> float:
    """Communication buffers: FSDP's gathered weights of two blocks (current and
    prefetched) and one block's unsharded gradients; the sequence-parallel gather of one
    activation; the all-to-all send and receive buffers of one MoE block."""
    per = state_bytes(strategy.dtype)
    d = activation_bytes(strategy.dtype)
    tokens = strategy.mbs * model.seq_len / strategy.cp
    n = 0.0
    if strategy.zero == 3:
        n += largest_block.total * (2 * per.weights + per.grads)
    if strategy.tp > 1:
        n += d * tokens * model.hidden_size
    if strategy.ep > 1 and model.moe is not None:
        n += 2 * d * tokens * model.moe.top_k * model.hidden_size / strategy.tp
    return n


def grad_bytes(strategy: Strategy, runtime: Runtime) -> int:
    """Bytes per gradient element in the data-parallel reduction."""
    if runtime.grad_reduce_bytes is not None:
        return runtime.grad_reduce_bytes
    return DTYPE_BYTES[DTYPE_KINDS[strategy.dtype].compute]  # FP8 gradients reduce in bf16
