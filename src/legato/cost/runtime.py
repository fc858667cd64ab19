"""Runtime: software choices of a training run that change its cost but not its math.

The specs say what is trained and how it is split; these flags say how the kernels and
the framework behave. The defaults describe a current PyTorch stack (fused attention, no
dropout, gradients reduced in the training dtype); Megatron-LM of 2021-22 materialised the
attention scores and used dropout, which ``Runtime(flash_attention=False, dropout=True)``
describes; torchtitan-style eager PyTorch (no torch.compile) runs norms, RoPE and SwiGLU
as separate kernels: ``fused_elementwise=False``.

How a framework moves weights and gradients is part of the runtime too: the unit it
gathers (a block, or each submodule's parameters), how far it prefetches, its gradient
buckets, and the share of the SMs its collectives hold while they overlap compute. Named
framework profiles (``profile=fsdp2``, ``megatron-te``, ``deepspeed-zero``, ...) set these
fields together (``cost.runtime_profiles``); keys given beside a profile override it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, get_type_hints

from legato.cost.runtime_profiles import profile_behaviours
from legato.errors import ConfigError
from legato.specs.dtypes import DTYPE_KINDS
from legato.specs.typed import FLAG_WORDS, from_dict, key_value_items

DTYPE_BYTES = {name: kind.bytes for name, kind in DTYPE_KINDS.items()}
HOST_LINK_GBPS = 55.0  # PCIe 5.0 x16, effective GB/s one way per GPU (H100/H800 class)
# NCCL runs each channel as one CTA resident on an SM for the whole collective (NCCL docs,
# NCCL_MIN_CTAS / NCCL_MAX_CTAS: "CTAs (channels)"); rings over 8-NIC nodes open 16
# channels, 16 of an A100's 108 and an H100's 132 SMs: about one eighth, which the GEMMs
# running beside a collective lose.
NCCL_SM_SHARE = 0.125
PARAM_UNITS = ("block", "param")
# what "selective" recompute keeps: Megatron's core attention (Korthikanti et al.),
# torchtitan's op-level policy (every other matmul output and attention), or torchtitan's
# layer-level policy (every second block checkpointed whole)
SELECTIVE_POLICIES = ("attention", "ops", "blocks")


@dataclass(frozen=True)
class Runtime:
    """``flash_attention``: a fused kernel that never stores the s x s scores and skips the
    masked half of causal attention. ``dropout``: dropout on attention probabilities and
    after both projections (stores a one-byte mask each). ``fused_elementwise``: norms,
    RoPE and the gated activation are single fused kernels (Megatron, torch.compile) rather
    than chains of eager ops. ``grad_reduce_bytes``: bytes per gradient element in the
    data-parallel reduction (None: the training dtype's; FSDP2's default fp32 reduction
    is 4). ``host_link_gbps``: the device's link to host memory, GB/s one way, which
    activation swap uses (not in ``DeviceSpec``; the default is PCIe 5.0 x16).
    ``loss_bytes``: bytes per logit element of the loss's working copy: 4 when it upcasts
    the logits to fp32 (Megatron, legato, autocast), 2 when it stays in the training dtype
    (FSDP's PURE bf16 mixed precision). ``tp_comm_overlap``: tensor-parallel collectives
    run chunked under the GEMMs next to them (Megatron/Transformer Engine comm-GEMM
    overlap), so they hide behind the blocks' non-attention compute instead of stalling
    it. ``per_microbatch_sync``: ZeRO-1/2 gather the weights and reduce-scatter the
    gradients every micro-batch (FSDP1's SHARD_GRAD_OP) instead of once per step.
    ``bubble_speedup``: how much faster the busy ranks run while the pipeline bubble idles
    the others, which the bubble's length is divided by: 1 where every rank owns its
    device; above 1 on a host whose processes share cores (more processes than cores),
    where an idle rank's share of the cores goes to the busy ones.

    ``profile``: the framework profile these fields came from (empty: none named).
    ``param_unit``: what ZeRO-3 gathers at once, a whole ``block`` (FSDP) or each
    submodule's parameters (``param``, DeepSpeed). ``prefetch_units``: gathers issued ahead
    of the unit computing; ``prefetch_numel`` (when > 0) instead prefetches upcoming units
    until this many parameters are in flight (DeepSpeed's bucket). ``reduce_bucket_numel``
    and ``reduce_bucket_per_rank``: gradients are reduced in buckets of ``max(numel,
    per_rank x ranks)`` parameters as the backward fills them (0: one reduction per unit).
    ``comm_sm_share``: the share of the SMs a collective holds while it overlaps compute,
    which that compute loses. ``selective``: what ``recompute=selective`` keeps (see
    ``SELECTIVE_POLICIES``)."""

    flash_attention: bool = True
    dropout: bool = False
    fused_elementwise: bool = True
    grad_reduce_bytes: int | None = None
    host_link_gbps: float = HOST_LINK_GBPS
    loss_bytes: int = 4
    tp_comm_overlap: bool = False
    per_microbatch_sync: bool = False
    bubble_speedup: float = 1.0
    profile: str = ""
    param_unit: str = "block"
    prefetch_units: int = 1
    prefetch_numel: float = 0.0
    reduce_bucket_numel: float = 0.0
    reduce_bucket_per_rank: float = 0.0
    comm_sm_share: float = NCCL_SM_SHARE
    selective: str = "attention"

    def reduce_bucket(self, ranks: int) -> float:
        """Parameters per gradient bucket over ``ranks`` (0: one reduction per unit)."""
        return max(self.reduce_bucket_numel, self.reduce_bucket_per_rank * ranks)


@dataclass(frozen=True)
class OpBytes:
    """Bytes read and written per element by each memory-bound op of a block (forward)."""

    norm: float  # per hidden element, each of the two norms
    residual: float  # per hidden element, each of the two residual adds (+ dropout mask)
    rope: float  # per Q and K element
    activation: float  # per FFN element (per expert FFN element for MoE)
    layout: float  # per Q, K, V and output element: transposes around eager attention


REDUCED_BYTES = (2, 4)  # bf16/fp16 or fp32 gradient reduction and loss


def parse_runtime(source: str | dict[str, Any] | None, where: str = "runtime") -> Runtime:
    """A Runtime from ``flash_attention=0,dropout=1,grad_reduce_bytes=4,loss_bytes=2,...``
    (the command line) or a table of those keys (a ``--batch`` line); ``profile=NAME``
    starts from that framework profile's behaviours, which the other keys override. None
    or empty: the defaults. ConfigError (one line, naming the key) otherwise."""
    if source is None or source == "":
        return Runtime()
    if isinstance(source, str):
        source = _pairs(source, where)
    if not isinstance(source, dict):
        raise ConfigError(f"{where}: expected key=value pairs or a table, got {source!r}")
    if "profile" in source:
        name = source["profile"]
        source = {**profile_behaviours(str(name), where), **source}
    runtime = from_dict(Runtime, source, where, ConfigError)
    _check(runtime, where)
    return runtime


def _check(runtime: Runtime, where: str) -> None:
    for key in ("grad_reduce_bytes", "loss_bytes"):
        value = getattr(runtime, key)
        if value not in (None, *REDUCED_BYTES):
            raise ConfigError(f"{where}.{key}: must be 2 (bf16/fp16) or 4 (fp32), got {value}")
    if not runtime.host_link_gbps > 0:
        raise ConfigError(f"{where}.host_link_gbps: must be > 0, got {runtime.host_link_gbps}")
    if not runtime.bubble_speedup >= 1:
        raise ConfigError(f"{where}.bubble_speedup: must be >= 1, got {runtime.bubble_speedup}")
    for key, allowed in (("param_unit", PARAM_UNITS), ("selective", SELECTIVE_POLICIES)):
        if getattr(runtime, key) not in allowed:
            raise ConfigError(
                f"{where}.{key}: must be one of {', '.join(allowed)}, got {getattr(runtime, key)!r}"
            )
    if runtime.prefetch_units < 1:
        raise ConfigError(f"{where}.prefetch_units: must be >= 1, got {runtime.prefetch_units}")
    for key in ("prefetch_numel", "reduce_bucket_numel", "reduce_bucket_per_rank"):
        if getattr(runtime, key) < 0:
            raise ConfigError(f"{where}.{key}: must be >= 0, got {getattr(runtime, key)}")
    if not 0 <= runtime.comm_sm_share < 1:
        raise ConfigError(f"{where}.comm_sm_share: must be in [0, 1), got {runtime.comm_sm_share}")


def _pairs(text: str, where: str) -> dict[str, Any]:
    """``key=value`` items typed by Runtime's fields (booleans as 0/1/true/false)."""
    kinds = get_type_hints(Runtime)
    out: dict[str, Any] = {}
    for key, value in key_value_items(text, kinds, where, ConfigError):
        kind = kinds[key]
        try:
            if kind is str:
                out[key] = value
            elif kind is bool:
                if value.lower() not in FLAG_WORDS:
                    raise ValueError
                out[key] = FLAG_WORDS[value.lower()]
            else:
                out[key] = float(value) if kind is float else int(value)
        except ValueError:
            allowed = {bool: "0/1/true/false", float: "a number"}.get(kind, "an integer")
            raise ConfigError(f"{where}.{key}: must be {allowed}, got {value!r}") from None
    return out


def op_bytes(runtime: Runtime, d: int, mlp: str) -> OpBytes:
    """Fused kernels read their inputs and write their outputs once. Eager PyTorch, counted
    op by op: RMSNorm upcasts to fp32, squares, averages, scales, downcasts and multiplies
    by the weight (``2d + 32`` bytes); RoPE upcasts, multiplies in complex fp32 and
    downcasts (``2d + 16``); SwiGLU runs SiLU then a product (``5d`` instead of ``3d``);
    attention inputs and output are made contiguous around the kernel (``2d`` each)."""
    mask = 1 if runtime.dropout else 0
    gated = mlp == "swiglu"
    if runtime.fused_elementwise:
        return OpBytes(2 * d, 3 * d + mask, 2 * d, (3 if gated else 2) * d, 0.0)
    return OpBytes(2 * d + 32, 3 * d + mask, 2 * d + 16, (5 if gated else 2) * d, 2 * d)


def activation_bytes(dtype: str) -> int:
    """Bytes of one activation element: fp8 training keeps activations in bf16."""
    return max(DTYPE_BYTES[dtype], 2)


@dataclass(frozen=True)
class KernelCounts:
    """Kernels of one micro-batch's pass that pay ``Calibration.kernel_overhead_s``."""

    block_fwd: int  # per transformer block
    block_bwd: int
    edge_fwd: int  # embedding, final norm, LM head and loss, on their stages
    edge_bwd: int


def kernels_per_pass(runtime: Runtime) -> KernelCounts:
    """Kernels over whole activations (every element, not per-token statistics such as the
    norms' mean and rsqrt, which stay under a CPU's parallel grain size), counted with a
    dispatch hook on legato's dense block (RMSNorm, RoPE, SwiGLU, SDPA; torch 2.13): eager,
    35 forward and 51 backward per block, 9 and 14 at the edges. Fused elementwise runs each
    norm, the RoPE of Q and of K and the activation as one kernel per pass: 22 and 29 per
    block, 7 and 8 at the edges. Materialised attention (counted by hand) runs QK^T, the
    softmax and AV (and the probabilities' dropout) where SDPA runs one kernel; its
    backward two GEMMs each and the softmax (and dropout) backward. MoE routing kernels
    and the optimizer's are not counted."""
    counts = (
        KernelCounts(22, 29, 7, 8) if runtime.fused_elementwise else KernelCounts(35, 51, 9, 14)
    )
    if runtime.flash_attention:
        return counts
    dropout = int(runtime.dropout)
    return replace(
        counts,
        block_fwd=counts.block_fwd + 2 + dropout,
        block_bwd=counts.block_bwd + 4 + dropout,
    )
