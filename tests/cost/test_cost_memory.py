"""Memory terms against hand computations: Korthikanti's activation formula, ZeRO, Adam."""

from __future__ import annotations

import pytest

from legato.cost import predict
from legato.cost.memory import (
    GIB,
    DeviceParams,
    block_activations,
    model_states,
    state_bytes,
)
from legato.cost.runtime import Runtime
from legato.specs import count_params, load_cluster, load_model
from legato.specs.strategy import Strategy

MEGATRON = Runtime(flash_attention=False, dropout=True)


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt3-175b")  # h = 12288, a = 96, s = 2048, GeLU MLP of 4h


def _korthikanti(spec, t, sp):
    """Korthikanti et al. 2022, eqs. 2-3: bytes per layer per sequence in fp16."""
    s, h, a = spec.seq_len, spec.hidden_size, spec.num_heads
    if sp:
        return s * h / t * (34 + 5 * a * s / h)
    return s * h * (10 + 24 / t + 5 * a * s / (h * t))


@pytest.mark.parametrize("sp", [False, True])
def test_gpt_layer_matches_korthikanti(gpt, sp):
    strategy = Strategy(tp=8, sp=sp, dtype="fp16")
    acts = block_activations(gpt, False, strategy, MEGATRON)
    assert acts.none == pytest.approx(_korthikanti(gpt, 8, sp), rel=1e-12)


def test_selective_and_full_recompute_match_korthikanti(gpt):
    s, h = gpt.seq_len, gpt.hidden_size
    with_sp = block_activations(gpt, False, Strategy(tp=8, sp=True, dtype="fp16"), MEGATRON)
    assert with_sp.selective == pytest.approx(34 * s * h / 8, rel=1e-12)
    without = block_activations(gpt, False, Strategy(tp=8, dtype="fp16"), MEGATRON)
    assert without.full == 2 * s * h
    assert with_sp.full == 2 * s * h / 8


def test_fused_attention_and_no_dropout_drop_the_quadratic_term(gpt):
    strategy = Strategy(tp=8, sp=True, dtype="fp16")
    fused = block_activations(gpt, False, strategy, Runtime())
    s, h, a = gpt.seq_len, gpt.hidden_size, gpt.num_heads
    # 34 - 2 dropout masks = 32 s h bytes; plus fp32 softmax statistics per head.
    assert fused.none == pytest.approx(s * h / 8 * 32 + 4 * s * a / 8, rel=1e-12)
    assert fused.selective == fused.none


def test_gqa_and_swiglu_generalisation():
    spec = load_model("llama3-70b")  # 64 heads, 8 KV heads, ffn 28672
    s, h, f, d = spec.seq_len, spec.hidden_size, spec.ffn_hidden_size, 2
    acts = block_activations(spec, False, Strategy(tp=1), Runtime()).none
    q_and_out, k_and_v = 2 * d * s * h, 2 * d * s * h * 8 / 64
    expected = 4 * d * s * h + q_and_out + k_and_v + 3 * d * s * f + 4 * s * spec.num_heads
    assert acts == pytest.approx(expected, rel=1e-12)


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    for dtype in ("bf16", "fp16", "fp32"):
        per = state_bytes(dtype)
        assert per.weights + per.grads + per.optimizer == 16
    assert state_bytes("bf16").optimizer == 12  # fp32 master weights and two moments


@pytest.mark.parametrize(
    ("zero", "divided"),
    [(0, (1, 1, 1)), (1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8))],
)
def test_zero_stages_shard_over_dp_times_cp(zero, divided):
    held = DeviceParams(dense=1e9, experts=0.0)
    states = model_states(held, Strategy(dp=4, cp=2, zero=zero))
    assert states == pytest.approx(
        tuple(b * 1e9 / k for b, k in zip((2, 2, 12), divided, strict=True))
    )


def test_experts_shard_over_the_expert_data_parallel_group():
    held = DeviceParams(dense=0.0, experts=1e9)
    states = model_states(held, Strategy(dp=8, ep=4, zero=1))
    assert states[2] == pytest.approx(12e9 / 2)  # 8 / 4 = 2 replicas of each expert


def test_predicted_model_states_of_plain_data_parallel():
    spec = load_model("llama3-8b")
    cluster = load_cluster("dgx-a100", nodes=1)
    p = predict(spec, cluster, Strategy(dp=8, gbs=8))
    n = count_params(spec).total
    memory = p.breakdown["memory_gib"]
    assert memory["params"] == pytest.approx(2 * n / GIB, rel=1e-9)
    assert memory["optimizer"] == pytest.approx(12 * n / GIB, rel=1e-9)
    sharded = predict(spec, cluster, Strategy(dp=8, gbs=8, zero=3)).breakdown["memory_gib"]
    assert sharded["params"] == pytest.approx(memory["params"] / 8, rel=1e-9)
    assert sum(memory.values()) == pytest.approx(p.memory_gib)


def test_too_big_is_not_an_error_but_names_the_largest_term():
    spec = load_model("llama3-70b")
    p = predict(spec, load_cluster("dgx-a100", nodes=1), Strategy(dp=8, gbs=8))
    assert not p.fits
    assert "optimizer" in p.why_not_fits and "80 GiB" in p.why_not_fits
    ok = predict(
        load_model("llama3-8b"),
        load_cluster("dgx-a100", nodes=1),
        Strategy(dp=8, gbs=8, zero=3, recompute="full"),
    )
    assert ok.fits and ok.why_not_fits == ""


def test_a_loss_in_the_training_dtype_keeps_two_bytes_per_logit_less():
    """Runtime.loss_bytes=2 (FSDP PURE bf16: no fp32 upcast for the loss) saves 2 bytes
    per logit element of the micro-batch on the last stage, nothing else."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100", nodes=1)
    s = Strategy(dp=8, zero=3, mbs=2, gbs=16)
    fp32 = predict(model, cluster, s, runtime=Runtime(loss_bytes=4)).breakdown["memory_gib"]
    bf16 = predict(model, cluster, s, runtime=Runtime(loss_bytes=2)).breakdown["memory_gib"]
    saved = 2 * s.mbs * model.seq_len * model.vocab_size / GIB
    assert fp32["activations"] - bf16["activations"] == pytest.approx(saved)
    assert {k: v for k, v in fp32.items() if k != "activations"} == {
        k: v for k, v in bf16.items() if k != "activations"
    }
