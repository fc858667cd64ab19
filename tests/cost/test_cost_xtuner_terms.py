"""XTuner device-technique terms: what swap, chunked loss and FP8 do to memory and time."""

from __future__ import annotations

import pytest

from legato.cost.memory import GIB, logits_bytes
from legato.cost.xtuner_terms import (
    XTunerOptions,
    chunked_logits_bytes,
    fp8_activation_saving,
    fp8_linear_speedup,
    stored_per_block,
    swap_overhead,
    swap_traffic,
    xtuner_memory,
)
from legato.specs import load_device, load_model
from legato.specs.strategy import Strategy

MOE_200B = load_model("qwen3-235b-a22b").with_(seq_len=65536)  # XTuner's 200B-class case
FSDP = Strategy(dp=256, zero=3, mbs=1, gbs=256, recompute="full")
H800 = load_device("h800")


def test_200b_moe_at_64k_fits_an_h800_only_with_swap_and_chunked_loss() -> None:
    plain = xtuner_memory(MOE_200B, FSDP)
    both = xtuner_memory(MOE_200B, FSDP, XTunerOptions(swap=True, loss_chunk=4096))
    assert plain.total / GIB > H800.memory_gib > both.total / GIB
    assert both.params == plain.params and both.buffers == plain.buffers
    # what left the device is on the host: all but two blocks' checkpointed inputs
    assert plain.activations - both.activations == pytest.approx(both.host)
    block_input = 2 * 65536 * MOE_200B.hidden_size
    assert both.host == pytest.approx((MOE_200B.num_layers - 2) * block_input)
    assert plain.logits / both.logits > 10


def test_chunked_logits_scale_with_the_chunk_not_the_sequence() -> None:
    assert chunked_logits_bytes(MOE_200B, FSDP, None) == logits_bytes(MOE_200B, FSDP)
    small, large = (chunked_logits_bytes(MOE_200B, FSDP, c) for c in (1024, 2048))
    assert large - small == 4 * 1024 * MOE_200B.vocab_size
    vocab_parallel = FSDP.with_(dp=128, tp=2)  # each device holds half the vocabulary
    assert chunked_logits_bytes(MOE_200B, vocab_parallel, 1024) == pytest.approx(small / 2)


def test_swap_exposes_only_copy_time_beyond_compute() -> None:
    assert swap_traffic(10e9, 1.0, 4, 55.0).exposed_s == 0.0
    slow = swap_traffic(10e9, 0.05, 4, 50.0)  # 0.2 s per copy vs 0.05 s / 0.1 s compute
    assert slow.exposed_s == pytest.approx(4 * (0.15 + 0.1))
    assert slow.bytes_each_way == 40e9
    longer = swap_traffic(10e9, 0.05, 4, 50.0, backward_s=0.25)  # the copy in hides fully
    assert longer.exposed_s == pytest.approx(4 * 0.15)
    step = swap_overhead(MOE_200B, FSDP, H800, XTunerOptions(swap=True))
    assert step.exposed_s == 0.0  # 64K tokens of compute per block hide a PCIe copy
    assert step.bytes_each_way == pytest.approx(MOE_200B.num_layers * 2 * 65536 * 4096)


def test_fp8_caches_linear_inputs_in_about_half_the_bytes() -> None:
    none = Strategy(dp=256, zero=3, mbs=1, gbs=256, recompute="none")
    bf16 = stored_per_block(MOE_200B, none, fp8=False)
    fp8 = stored_per_block(MOE_200B, none, fp8=True)
    saving = fp8_activation_saving(MOE_200B, True, 65536)
    assert bf16[0][0] - fp8[0][0] == pytest.approx(saving)
    assert 0.2 < saving / bf16[0][0] < 0.5
    # tensor parallelism splits every cached input; the normed ones only with SP
    assert fp8_activation_saving(MOE_200B, True, 65536, tp=2, sp=True) == pytest.approx(saving / 2)
    assert fp8_activation_saving(MOE_200B, True, 65536, tp=2) > saving / 2
    speedup = fp8_linear_speedup(MOE_200B, H800, 65536)
    assert 1.0 < speedup < 2.0  # attention scores and the LM head stay in bf16
