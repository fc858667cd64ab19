"""How long one engine step takes on a modelled GPU, from the batch's composition.

Vidur's split (docs/serving.md, "Simulating"): token-level work scales with the tokens of
the step — each decoder layer's GEMMs (q/k/v, o, gate/up, down), its memory-bound ops
(norms, rotary, activation, residual adds) and the segmented LoRA GEMM; sequence-level
work is attention — a prefill chunk against its own context, the decode rows against
the KV they read; plus the LM head on the rows that sample, the tensor-parallel
all-reduces (two per layer) and the engine's CPU work per step. Every term is priced by
the device profile the training cost model uses (``legato.devices``: ``gemm_time``,
``attention_time``, ``memory_time``, ``collective_time``, ``step_overhead``); nothing here
is fitted. The LoRA term is Punica's SGMV / S-LoRA's MBGMM shape: per adapter in the
batch, a shrink ``[t, d_in] x [d_in, r]`` and an expand ``[t, r] x [r, d_out]`` on each
target layer, one kernel for all adapters, which reads every adapter's factors once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from legato.devices.profile import DTYPE_BYTES, DeviceProfile
from legato.specs.device import DeviceSpec
from legato.specs.model import ModelSpec

DTYPE = "fp16"
# elements read and written per token per hidden unit by a layer's memory-bound ops:
# two RMSNorms (read, write), rotary on q and k, two residual adds (two reads, a write)
ELEMENTWISE_PER_HIDDEN = 2 * 2 + 2 + 2 * 3


@dataclass(frozen=True)
class BatchRow:
    """One request's part of a step: ``tokens`` new ones after ``context`` cached ones,
    under an adapter of ``rank`` (0: the base model) named ``adapter``."""

    tokens: int
    context: int
    adapter: str | None = None
    rank: int = 0


class StepTimeModel:
    """Seconds of one step of ``model`` split over ``tp`` devices of ``device``, with LoRA
    on ``targets`` (projection names: q, k, v, o, gate, up, down)."""

    def __init__(
        self,
        model: ModelSpec,
        device: DeviceSpec,
        profile: DeviceProfile,
        tp: int = 1,
        targets: Sequence[str] = ("q", "k", "v", "o"),
    ) -> None:
        self.model, self.device, self.profile, self.tp = model, device, profile, tp
        h, hd = model.hidden_size, model.head_dim
        self.heads, self.kv_heads = model.num_heads / tp, model.num_kv_heads / tp
        ffn = model.ffn_hidden_size
        self.linears = [  # (out, in) per device, one layer
            ((self.heads + 2 * self.kv_heads) * hd, h),
            (h, self.heads * hd),
            (2 * ffn / tp, h),
            (h, ffn / tp),
        ]
        dims = {"q": (h, model.num_heads * hd), "k": (h, model.num_kv_heads * hd),
                "v": (h, model.num_kv_heads * hd), "o": (model.num_heads * hd, h),
                "gate": (h, ffn), "up": (h, ffn), "down": (ffn, h)}  # fmt: skip
        self.lora_dims = [dims[t] for t in targets]  # (in, out), whole (LoRA is not split)

    def layer_linear_time(self, tokens: float) -> float:
        """One layer's dense GEMMs and memory-bound ops over ``tokens`` rows."""
        gemm = sum(self.profile.gemm_time(tokens, n, k, DTYPE) for n, k in self.linears)
        width = DTYPE_BYTES[DTYPE] * tokens
        act = width * 3 * self.linears[3][1]  # SwiGLU: read gate and up, write their product
        elementwise = width * self.model.hidden_size * ELEMENTWISE_PER_HIDDEN
        return gemm + self.profile.memory_time(act + elementwise)

    def attention_time(self, rows: Sequence[BatchRow]) -> float:
        """One layer's attention: each prefill chunk against its context (the profile's
        fused-attention law), and the decode rows as one paged kernel bound by reading
        their keys and values (the profile's HBM bandwidth, the attention law's launch
        latency): cuDNN's paged decode reaches that bandwidth from a batch of a few
        sequences on (benchmarks/serving_step_time.py)."""
        hd, total = self.model.head_dim, 0.0
        kv_read = 0
        for r in rows:
            if r.tokens > 1:
                total += self.profile.attention_time(
                    1, r.tokens, r.context + r.tokens, self.heads, self.kv_heads, hd,
                    dtype="bf16",
                )  # fmt: skip
            else:
                kv_read += r.context + 1
        if kv_read:
            nbytes = DTYPE_BYTES[DTYPE] * 2 * kv_read * self.kv_heads * hd
            latency = self.profile.attention_law("bf16").latency_us * 1e-6
            total += latency + self.profile.memory_time(nbytes)
        return total

    def lora_time(self, rows: Sequence[BatchRow]) -> float:
        """One layer's segmented LoRA GEMMs: per target a shrink and an expand kernel over
        all rows, reading every adapter's factors once."""
        tokens: dict[str, int] = {}
        ranks: dict[str, int] = {}
        for r in rows:
            if r.adapter is not None and r.rank:
                tokens[r.adapter] = tokens.get(r.adapter, 0) + r.tokens
                ranks[r.adapter] = r.rank
        if not tokens:
            return 0.0
        law, bw = self.profile.gemm_law(DTYPE), self.profile.memory_bandwidth
        t = sum(tokens.values())
        rank = sum(tokens[a] * ranks[a] for a in tokens) / t  # token-weighted mean rank
        factors = sum(ranks.values())  # every adapter's rank, its factors read once
        total = 0.0
        for d_in, d_out in self.lora_dims:
            shrink = DTYPE_BYTES[DTYPE] * (t * d_in + factors * d_in + t * rank)
            expand = DTYPE_BYTES[DTYPE] * (t * rank + factors * d_out + t * d_out)
            total += law.time(t, rank, d_in, 1, shrink, bw)
            total += law.time(t, d_out, rank, 1, expand, bw)
        return total

    def step_time(self, rows: Sequence[BatchRow]) -> float:
        """Seconds of one engine step running ``rows``."""
        if not rows:
            return 0.0
        tokens = sum(r.tokens for r in rows)
        layer = self.layer_linear_time(tokens) + self.attention_time(rows)
        layer += self.lora_time(rows) + 2 * self._all_reduce(tokens)
        head = self.profile.gemm_time(len(rows), self.model.vocab_size / self.tp,
                                      self.model.hidden_size, DTYPE)  # fmt: skip
        return self.model.num_layers * layer + head + self.profile.step_overhead(len(rows))

    def _all_reduce(self, tokens: int) -> float:
        nbytes = DTYPE_BYTES[DTYPE] * tokens * self.model.hidden_size
        link = self.device.link
        return self.profile.collective_time("all_reduce", nbytes, self.tp,
                                            link.bandwidth_gbps, link.latency_us)  # fmt: skip
