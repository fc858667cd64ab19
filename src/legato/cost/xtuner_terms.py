"""Cost terms of XTuner V1's device techniques: activation swap, chunked loss, tile-wise FP8.

Pure Python on top of ``cost.memory`` (same activation, state and buffer formulas), so a
prediction with these techniques differs from one without only by the terms below:

* **swap** (``legato.memory.ActivationSwap``): a block's stored activations (with full
  recompute: its input) go to host memory in forward and come back one block ahead in
  backward, so the device holds at most ``1 + prefetch`` blocks' worth instead of all of
  them. The copies ride the host link (PCIe) both ways; per block they overlap that
  block's compute, and only the excess is exposed. The host holds the rest.
* **chunked loss** (``legato.memory.chunked_cross_entropy``): the fp32 logits and their
  gradient exist for ``chunk`` tokens at a time instead of all tokens.
* **fp8** (``legato.precision``, tile-wise): linear-layer inputs are cached for backward as
  e4m3 plus one fp32 scale per 128 values (1.03 bytes instead of 2), and the linear GEMMs
  run at the device's fp8 peak; attention scores, norms and the LM head stay in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from legato.cost.flops import forward_flops
from legato.cost.memory import (
    GIB,
    DeviceParams,
    block_activations,
    block_params,
    comm_buffer_bytes,
    edge_params,
    logits_bytes,
    model_states,
)
from legato.cost.runtime import HOST_LINK_GBPS, Runtime
from legato.specs.device import DeviceSpec
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy

FP8_CACHED_BYTES = 1 + 4 / 128  # e4m3 value plus its share of a 1x128 tile's fp32 scale
SWAP_PREFETCH = 1  # blocks ``ActivationSwap`` brings back ahead of their backward
_RUNTIME = Runtime()  # current PyTorch defaults (fused attention, no dropout)


@dataclass(frozen=True)
class XTunerOptions:
    """Which techniques are on. ``loss_chunk``: tokens per loss chunk (None: unchunked);
    ``prefetch``: blocks fetched ahead in backward; ``host_link_gbps``: GB/s one way."""

    swap: bool = False
    loss_chunk: int | None = None
    fp8: bool = False
    prefetch: int = SWAP_PREFETCH
    host_link_gbps: float = HOST_LINK_GBPS  # PCIe 5.0 x16


@dataclass(frozen=True)
class XTunerMemory:
    """Peak bytes per device by term (FSDP-only, no pipeline), and host bytes for swap."""

    params: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    buffers: float
    host: float

    @property
    def total(self) -> float:
        return (
            self.params + self.grads + self.optimizer + self.activations + self.logits
        ) + self.buffers

    def gib(self) -> dict[str, float]:
        terms = ("params", "grads", "optimizer", "activations", "logits", "buffers", "host")
        return {t: getattr(self, t) / GIB for t in terms} | {"total": self.total / GIB}


def linear_input_elements(
    model: ModelSpec, is_moe: bool, tokens: float, tp: int = 1, sp: bool = False
) -> float:
    """Elements of one block's saved linear-layer inputs on one device (what FP8 caching
    shrinks): the normed input of Q/K/V and of the MLP (or each routed copy; replicated
    over ``tp`` unless sequence parallel), the attention output entering o_proj and the
    activation output entering down_proj (split by ``tp``), as ``cost.memory`` counts them."""
    h = model.hidden_size
    attn_out = model.num_heads * (model.mla.v_head_dim if model.mla else model.head_dim)
    n = tokens * 2 * h / (tp if sp else 1) + tokens * attn_out / tp
    if is_moe:
        moe = model.moe
        n += tokens * moe.top_k * (h + moe.expert_ffn_hidden_size) / tp
        n += tokens * moe.num_shared_experts * moe.shared_expert_ffn_hidden_size / tp
    else:
        n += tokens * model.ffn_hidden_size / tp
    return n


def fp8_activation_saving(
    model: ModelSpec, is_moe: bool, tokens: float, tp: int = 1, sp: bool = False
) -> float:
    """Bytes saved per block by caching linear inputs in FP8 instead of bf16."""
    return linear_input_elements(model, is_moe, tokens, tp, sp) * (2 - FP8_CACHED_BYTES)


def chunked_logits_bytes(
    model: ModelSpec, strategy: Strategy, chunk: int | None, loss_bytes: int = 4
) -> float:
    """Logits memory of the loss: all tokens (``cost.memory.logits_bytes``) or one chunk
    of fp32 logits reused for their gradient, plus the fp32 head-weight gradient buffer
    (both over the device's vocabulary shard)."""
    if not chunk:
        return logits_bytes(model, strategy, loss_bytes)
    tokens = min(chunk, strategy.mbs * model.seq_len / strategy.cp)
    return 4 * (tokens + model.hidden_size) * model.vocab_size / strategy.tp


@dataclass(frozen=True)
class SwapTraffic:
    """Host-link bytes of one step (each way) and the copy time not hidden by compute."""

    bytes_each_way: float
    exposed_s: float


def swap_traffic(
    stored_per_block: float,
    block_compute_s: float,
    blocks: float,
    link_gbps: float,
    backward_s: float | None = None,
) -> SwapTraffic:
    """Each block's copy out overlaps its forward, its copy in the next block's backward
    (``backward_s``; default twice the forward): the exposed time is the excess over
    that compute."""
    copy_s = stored_per_block / (link_gbps * 1e9)
    back = 2 * block_compute_s if backward_s is None else backward_s
    exposed = blocks * (max(0.0, copy_s - block_compute_s) + max(0.0, copy_s - back))
    return SwapTraffic(stored_per_block * blocks, exposed)


def block_stored(
    model: ModelSpec, is_moe: bool, strategy: Strategy, fp8: bool, runtime: Runtime = _RUNTIME
) -> tuple[float, float]:
    """(stored between forward and backward, all while recomputed) bytes of one block on
    one device, with linear inputs cached in FP8 when ``fp8``."""
    acts = block_activations(model, is_moe, strategy, runtime)
    saving = 0.0
    if fp8:
        tokens = strategy.mbs * model.seq_len / strategy.cp
        saving = fp8_activation_saving(model, is_moe, tokens, strategy.tp, strategy.sp)
    stored = acts.stored(strategy.recompute, runtime.selective)
    if strategy.recompute != "full":
        stored -= saving
    return stored, acts.none - saving


def swap_resident(stored: list[float], prefetch: int = SWAP_PREFETCH) -> float:
    """Bytes of the ``stored`` blocks that stay on the device with swap: the block being
    computed and the ``prefetch`` ones fetched ahead (the largest, to be safe)."""
    return sum(sorted(stored)[-(1 + prefetch) :])


def stored_per_block(
    model: ModelSpec, strategy: Strategy, fp8: bool, runtime: Runtime = _RUNTIME
) -> list[tuple[float, float]]:
    """(stored between forward and backward, all while recomputed) bytes of each block."""
    return [
        block_stored(model, model.is_moe_layer(layer), strategy, fp8, runtime)
        for layer in range(model.num_layers)
    ]


def xtuner_memory(
    model: ModelSpec,
    strategy: Strategy,
    options: XTunerOptions = XTunerOptions(),
    runtime: Runtime = _RUNTIME,
    framework_gib: float = 3.0,
) -> XTunerMemory:
    """Peak memory of one device of an FSDP-only run (``zero=3``; pp = tp = 1)."""
    per_layer = [block_params(model, i, strategy) for i in range(model.num_layers)]
    edge = edge_params(model, strategy, first=True, last=True)
    held = DeviceParams(edge + sum(b.dense for b in per_layer), sum(b.experts for b in per_layer))
    weights, grads, optimizer = model_states(held, strategy)
    blocks = stored_per_block(model, strategy, options.fp8, runtime)
    stored = [b[0] for b in blocks]
    working = max(b[1] for b in blocks) if strategy.recompute == "full" else 0.0
    host = 0.0
    if options.swap:
        resident = swap_resident(stored, options.prefetch)
        host = sum(stored) - resident
        stored = [resident]
    largest = max(per_layer, key=lambda b: b.total)
    buffers = framework_gib * GIB + comm_buffer_bytes(largest, model, strategy)
    logits = chunked_logits_bytes(model, strategy, options.loss_chunk)
    return XTunerMemory(weights, grads, optimizer, sum(stored) + working, logits, buffers, host)


def swap_overhead(
    model: ModelSpec,
    strategy: Strategy,
    device: DeviceSpec,
    options: XTunerOptions,
    efficiency: float = 0.4,
) -> SwapTraffic:
    """Host-link traffic of a step with swap on, and its exposed time, with every block's
    forward at ``efficiency`` of the device's peak for the strategy's dtype."""
    blocks = stored_per_block(model, strategy, options.fp8)
    tokens = strategy.mbs * model.seq_len / strategy.cp
    f = forward_flops(model, 1, model.seq_len)
    flops = (f.total - f.lm_head) * tokens / model.seq_len
    block_s = flops / model.num_layers / (device.peak_flops(strategy.dtype) * efficiency)
    largest = max(b[0] for b in blocks)
    per_block = swap_traffic(largest, block_s, 1, options.host_link_gbps)
    return SwapTraffic(sum(b[0] for b in blocks), per_block.exposed_s * model.num_layers)


def fp8_linear_speedup(model: ModelSpec, device: DeviceSpec, seq_len: int) -> float:
    """Amdahl bound of a step's matmul time when the block linears run at the fp8 peak
    and attention scores and the LM head stay at the bf16 peak (same efficiency)."""
    f = forward_flops(model, 1, seq_len)
    stay = f.attention_scores + f.lm_head
    bf16, fp8 = device.peak_flops("bf16"), device.peak_flops("fp8")
    return (f.total / bf16) / (stay / bf16 + (f.total - stay) / fp8)
