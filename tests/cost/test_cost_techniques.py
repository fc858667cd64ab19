"""predict with the device techniques of a strategy: MoE overlap schedules, activation
swap, chunked loss and tile-wise FP8 enter as their own terms and only exposed time adds."""

from __future__ import annotations

import pytest

from legato.cost import Runtime, predict
from legato.cost.calibration import CALIBRATION
from legato.cost.compute import DeviceModel
from legato.cost.memory import GIB, logits_bytes
from legato.cost.mesh import mesh_axes
from legato.cost.moe_layer_time import MoEWork, moe_layer_time
from legato.cost.xtuner_terms import (
    XTunerOptions,
    chunked_logits_bytes,
    fp8_activation_saving,
    fp8_linear_speedup,
    xtuner_memory,
)
from legato.errors import SpecError
from legato.specs import load_cluster, load_model
from legato.specs.strategy import Strategy

MIXTRAL = load_model("mixtral-8x7b").with_(seq_len=4096)
QWEN_64K = load_model("qwen3-235b-a22b").with_(seq_len=65536)  # XTuner's 200B-class case
FSDP = Strategy(dp=256, zero=3, mbs=1, gbs=256, recompute="full")
# EP 8 with TP 2: every expert-parallel group spans two nodes (InfiniBand)
EP_OVER_IB = Strategy(dp=32, tp=2, sp=True, ep=8, zero=1, gbs=64)


def _explained(p) -> float:
    b = p.breakdown
    terms = b["compute_s"] + b["recompute_s"] + b["contention_s"] + b["bubble_s"]
    return terms + b["optimizer_s"] + sum(b["exposed_comm_s"].values())


def _schedules():
    return {
        "none": EP_OVER_IB,
        "domino": EP_OVER_IB.with_(moe_overlap="domino", moe_chunks=2),
        "comet": EP_OVER_IB.with_(moe_overlap="comet", moe_chunks=4, moe_groups=2),
    }


def test_moe_overlap_hides_expert_parallel_traffic_and_only_exposed_time_adds():
    cluster = load_cluster("h800", nodes=8)
    runs = {name: predict(MIXTRAL, cluster, s) for name, s in _schedules().items()}
    plain = runs["none"].breakdown
    assert plain["moe_overlap"]["schedule"] == "plain"
    assert plain["moe_overlap"]["hidden_fraction"] == pytest.approx(0.0, abs=1e-9)
    # nothing hides, and the dp traffic sharing its link is charged with the delay it causes
    assert plain["exposed_comm_s"]["ep"] == pytest.approx(plain["comm_s"]["ep"])
    for run in runs.values():  # no axis is exposed for longer than its traffic takes
        b = run.breakdown
        assert all(b["exposed_comm_s"][a] <= b["comm_s"][a] * (1 + 1e-9) for a in b["comm_s"])
    for name in ("domino", "comet"):
        b = runs[name].breakdown
        assert b["moe_overlap"]["schedule"] == name
        assert b["exposed_comm_s"]["ep"] < plain["exposed_comm_s"]["ep"]
        assert b["comm_s"]["ep"] > plain["comm_s"]["ep"]  # more, smaller all-to-alls
        assert runs[name].step_time_s < runs["none"].step_time_s
        assert b["memory_gib"] == plain["memory_gib"]
    for p in runs.values():
        assert _explained(p) == pytest.approx(p.step_time_s, rel=1e-9)


def test_moe_overlap_terms_are_the_layer_model():
    """The per-layer figures predict reports are ``moe_layer_time`` of the device's
    tokens over the EP group's link, and the layers' compute plus exposed EP traffic gain
    what ``moe_layer_time`` says (EP inside a node here: no other traffic shares its link;
    the data-parallel traffic hides a little more behind the longer compute)."""
    cluster = load_cluster("h800", nodes=8)
    none = Strategy(dp=64, ep=8, zero=1, gbs=64)
    s = none.with_(moe_overlap="comet", moe_chunks=4, moe_groups=2)
    device = DeviceModel.of(cluster.device, "bf16", CALIBRATION)
    link = mesh_axes(s, cluster)["ep"].link("all_to_all")
    work = MoEWork.of(MIXTRAL, s.mbs * MIXTRAL.seq_len, s.ep)
    comet = moe_layer_time(work, device, link, "comet", 4, 2)
    plain = moe_layer_time(work, device, link)
    terms = predict(MIXTRAL, cluster, s).breakdown["moe_overlap"]
    assert terms["layer_s"] == pytest.approx(comet.seconds)
    assert terms["plain_layer_s"] == pytest.approx(plain.seconds)
    exposed = comet.exposed_forward_s + comet.exposed_backward_s
    assert exposed == pytest.approx(comet.exposed_comm_s)

    def layer_terms(strategy: Strategy) -> float:  # what the MoE layers change
        b = predict(MIXTRAL, cluster, strategy).breakdown
        return b["compute_s"] + b["exposed_comm_s"]["ep"]

    layers = MIXTRAL.num_moe_layers * s.num_microbatches
    gained = layer_terms(none) - layer_terms(s)
    assert gained == pytest.approx(layers * (plain.seconds - comet.seconds))


def test_without_overlap_every_schedule_is_plain():
    cluster = load_cluster("h800", nodes=8)
    steps = {
        name: predict(MIXTRAL, cluster, s, overlap=False).step_time_s
        for name, s in _schedules().items()
    }
    assert steps["comet"] == pytest.approx(steps["none"]) == pytest.approx(steps["domino"])


@pytest.mark.parametrize(
    "recompute, swap, chunk, fp8",
    [("full", False, 0, False), ("full", True, 4096, False), ("none", True, 4096, True),
     ("full", True, 0, False), ("full", False, 4096, True)],
)  # fmt: skip
def test_predicted_memory_is_xtuner_memory(recompute, swap, chunk, fp8):
    s = FSDP.with_(recompute=recompute, swap=swap, loss_chunk=chunk, dtype="fp8" if fp8 else "bf16")
    p = predict(QWEN_64K, load_cluster("h800", nodes=32), s)
    x = xtuner_memory(QWEN_64K, s, XTunerOptions(swap=swap, loss_chunk=chunk or None, fp8=fp8))
    assert p.memory_gib == pytest.approx(x.total / GIB, rel=1e-12)
    assert p.breakdown.get("swap", {}).get("host_gib", 0.0) == pytest.approx(x.host / GIB)


def test_swap_adds_only_host_copies_that_compute_does_not_hide():
    cluster = load_cluster("h800", nodes=32)
    base = predict(QWEN_64K, cluster, FSDP)
    swapped = predict(QWEN_64K, cluster, FSDP.with_(swap=True))
    assert swapped.memory_gib < base.memory_gib - 40
    b = swapped.breakdown
    copies = 2 * QWEN_64K.num_layers * 2 * 65536 * QWEN_64K.hidden_size / 55e9  # block inputs
    assert b["comm_s"]["host"] == pytest.approx(copies)
    assert b["exposed_comm_s"].get("host", 0.0) == 0.0  # 64K tokens of compute hide each copy
    assert swapped.step_time_s == pytest.approx(base.step_time_s)
    slow = predict(QWEN_64K, cluster, FSDP.with_(swap=True), runtime=Runtime(host_link_gbps=0.2))
    exposed = slow.breakdown["exposed_comm_s"]["host"]
    assert 0 < exposed < slow.breakdown["comm_s"]["host"]
    assert slow.step_time_s - base.step_time_s == pytest.approx(exposed)
    assert _explained(slow) == pytest.approx(slow.step_time_s)


def test_chunked_loss_shrinks_the_logits_and_costs_no_time():
    cluster = load_cluster("h800", nodes=32)
    whole = predict(QWEN_64K, cluster, FSDP)
    chunked = predict(QWEN_64K, cluster, FSDP.with_(loss_chunk=4096))
    saved = logits_bytes(QWEN_64K, FSDP) - chunked_logits_bytes(QWEN_64K, FSDP, 4096)
    assert (whole.memory_gib - chunked.memory_gib) * GIB == pytest.approx(saved)
    assert chunked.step_time_s == whole.step_time_s


def test_fp8_runs_block_linears_at_the_fp8_peak_and_caches_them_in_fp8():
    model, cluster = load_model("llama3-8b"), load_cluster("h800", nodes=1)
    s = Strategy(dp=8, zero=1, gbs=64)
    bf16, fp8 = predict(model, cluster, s), predict(model, cluster, s.with_(dtype="fp8"))
    speedup = bf16.step_time_s / fp8.step_time_s
    assert 1.05 < speedup < fp8_linear_speedup(model, cluster.device, model.seq_len)
    assert fp8.mfu / bf16.mfu == pytest.approx(speedup)  # both against the bf16 peak
    saved = model.num_layers * fp8_activation_saving(model, False, model.seq_len)
    gib = bf16.breakdown["memory_gib"]["activations"] - fp8.breakdown["memory_gib"]["activations"]
    assert gib * GIB == pytest.approx(saved)
    with pytest.raises(SpecError, match="no fp8 peak"):
        predict(model, load_cluster("dgx-a100", nodes=1), s.with_(dtype="fp8"))


def test_an_fp8_gemm_pays_its_quantisation_and_runs_at_the_fp8_law():
    """A compute-bound block linear in FP8: the profile's fp8 GEMM law (fitted on fp8
    cuBLASLt and torch.mm rows, well short of 2x bf16), plus one memory-bound pass per
    operand (read bf16, write fp8)."""
    from legato.cost.calibration import CALIBRATION
    from legato.cost.compute import DeviceModel, Gemm

    h100 = load_cluster("dgx-h100", nodes=1).device
    bf16, fp8 = (DeviceModel.of(h100, d, CALIBRATION) for d in ("bf16", "fp8"))
    g = Gemm(8192, 8192, 8192)
    gemm = fp8.profile.gemm_time(g.m, g.n, g.k, "fp8")
    quantise = fp8.memory_time(3 * 2 * 8192 * 8192)
    assert fp8.linear_time(g) == pytest.approx(gemm + quantise)
    assert fp8.gemm_time(g) == pytest.approx(bf16.gemm_time(g))  # attention, head: bf16
    laws = fp8.profile.gemm_law("fp8").rate(g.m, g.n, g.k) / bf16.gemm_rate(g.m, g.n, g.k)
    assert 1.2 < bf16.linear_time(g) / fp8.linear_time(g) < laws < 2
