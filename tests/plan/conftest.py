"""A small, known cost model for testing the search independently of ``legato.cost``.

Time: matmul FLOPs at a TP-dependent efficiency, an all-reduce-like TP term, a 1F1B-style
bubble shrunk by virtual stages, recompute as extra forward work, ZeRO-3 as extra data
traffic. Memory: 16 bytes per parameter sharded by TP/PP and ZeRO, plus Korthikanti-style
activations times the micro-batches in flight. Monotone in recompute and ZeRO stage, as the
search's dominance pruning assumes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pytest

from legato.cost.flops import training_flops_per_token
from legato.specs import count_params

GIB = 2**30


@dataclass(frozen=True)
class FakePrediction:
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_gib: float
    fits: bool
    why_not_fits: str = ""
    breakdown: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def fake_predict(model, cluster, s, *, overlap: bool = True) -> FakePrediction:
    devices = cluster.world_size
    tokens = s.gbs * model.seq_len
    flops = training_flops_per_token(model) * tokens
    recompute = {"none": 1.0, "selective": 1.05, "full": 4 / 3}[s.recompute]
    eff = 0.6 / (1 + 0.04 * s.tp)
    compute = flops * recompute / (devices * cluster.device.peak_flops("bf16") * eff)
    m = s.num_microbatches
    bubble = compute * (s.pp - 1) / (m * s.vpp) if s.pp > 1 else 0.0
    tp_comm = 1e-9 * tokens * model.hidden_size * model.num_layers * (s.tp - 1) / devices
    dp_comm = (0.01 if s.zero == 3 else 0.0) + 0.002 * s.zero
    step = compute + bubble + tp_comm + dp_comm
    params = count_params(model).total
    shard = s.dp * s.cp
    states = params * (2 / (shard if s.zero == 3 else 1) + 2 / (shard if s.zero >= 2 else 1)
                       + 12 / (shard if s.zero >= 1 else 1)) / (s.tp * s.pp)  # fmt: skip
    per_layer = model.seq_len * s.mbs * model.hidden_size / s.cp * 34 / s.tp
    per_layer *= {"none": 1.0, "selective": 0.7, "full": 2 / 34}[s.recompute]
    acts = per_layer * model.num_layers / s.pp * min(m, s.pp)
    memory = (states + acts) / GIB + 1.0
    fits = memory <= cluster.device.memory_gib
    terms = {"params": states / 8 / GIB, "grads": states / 8 / GIB}
    terms |= {"optimizer": states * 0.75 / GIB, "activations": acts / GIB, "buffers": 1.0}
    return FakePrediction(
        step_time_s=step,
        tokens_per_s=tokens / step,
        mfu=flops / (step * devices * cluster.device.peak_flops("bf16")),
        memory_gib=memory,
        fits=fits,
        why_not_fits="" if fits else max(terms, key=terms.get),
        breakdown={
            "compute_s": compute,
            "bubble_s": bubble,
            "exposed_comm_s": {"tp": tp_comm, "dp": dp_comm},
            "comm_s": {"tp": tp_comm, "dp": dp_comm},
            "memory_gib": terms,
        },
    )


@pytest.fixture
def fake_scorer():
    return fake_predict
