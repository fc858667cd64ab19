"""Closed forms of pipeline schedules: bubbles and micro-batches in flight."""

from __future__ import annotations

import pytest

from legato.cost.pipeline import in_flight_microbatches, p2p_messages, pipeline_time

P, M = 8, 32


def test_1f1b_and_gpipe_take_m_plus_p_minus_1_slots():
    for schedule in ("1f1b", "gpipe"):
        t = pipeline_time(schedule, P, M, 1, 1, 1.0, 2.0, 1.0)
        assert t.total_s == pytest.approx((M + P - 1) * 3.0)
        assert t.bubble_s == pytest.approx((P - 1) * 3.0)


@pytest.mark.parametrize(("p", "m"), [(4, 1), (4, 2), (8, 3)])
def test_1f1b_with_fewer_micro_batches_than_stages_runs_as_gpipe(p, m):
    """vTrain's Megatron runs used 1F1B with m < pp: the builder's warm-up takes all m
    forwards, so the makespan and the memory are GPipe's, and the closed forms say so."""
    from legato.schedule import build_schedule, simulate
    from legato.schedule.costs import CostModel

    model = CostModel(f=1, b=1, w=1)
    simulated = simulate(build_schedule("1f1b", stages=p, microbatches=m), model)
    gpipe = simulate(build_schedule("gpipe", stages=p, microbatches=m), model)
    assert simulated.makespan == pytest.approx(gpipe.makespan)
    assert pipeline_time("1f1b", p, m, 1, 1, 1, 2, 1).total_s == pytest.approx(simulated.makespan)
    assert in_flight_microbatches("1f1b", p, m, 1, 1) == max(simulated.peak_units) == m


def test_interleaving_divides_the_bubble_by_v():
    t = pipeline_time("interleaved", P, M, 4, 1, 1.0, 2.0, 1.0)
    assert t.total_s == pytest.approx((M + (P - 1) / 4) * 3.0)


def test_zero_bubble_forms_with_equal_f_b_w():
    """T_F = T_B = T_W: ZB-H1 leaves a third of 1F1B's bubble, ZB-V none."""
    one_f_one_b = pipeline_time("1f1b", P, M, 1, 1, 1.0, 2.0, 1.0).bubble_s
    assert pipeline_time("zb-h1", P, M, 1, 1, 1.0, 2.0, 1.0).bubble_s == pytest.approx(
        one_f_one_b / 3
    )
    assert pipeline_time("zb-v", P, M, 2, 1, 1.0, 2.0, 1.0).bubble_s == 0.0


@pytest.mark.parametrize("costs", [(1, 1, 1), (1, 1, 0.5), (1, 2, 1), (1, 1, 2), (2, 1, 1)])
@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 8), (8, 16)])
def test_zb_h1_and_zb_2p_forms_equal_the_simulated_makespan(costs, p, m):
    """Exact, not within a tolerance: both are closed forms of the builders' orders; ZB-2p's
    extra warm-up forwards and drained W passes take ZB-H1's ``- t_w`` to ZB-H2's ``- 2 t_w``,
    and neither bubble falls below the last stage's wait ``(p - 1) t_f`` for its first
    forward; ZB-2p holds 2p micro-batches (or all m) on every device."""
    from legato.schedule import build_schedule, simulate
    from legato.schedule.costs import CostModel

    f, b, w = costs
    model = CostModel(f=f, b=b, w=w)
    for name in ("zb-h1", "zb-2p"):
        simulated = simulate(build_schedule(name, stages=p, microbatches=m, costs=model), model)
        assert pipeline_time(name, p, m, 1, 1, f, b + w, w).total_s == pytest.approx(
            simulated.makespan
        ), name
        assert in_flight_microbatches(name, p, m, 1, 1) == max(simulated.peak_units), name


def test_slices_shrink_the_bubble_by_k():
    seq = pipeline_time("seq1f1b", P, M, 1, 4, 1.0, 2.0, 1.0)
    assert seq.bubble_s / seq.total_s == pytest.approx((P - 1) / (4 * M + P - 1))
    svpp = pipeline_time("svpp", P, M, 2, 4, 1.0, 2.0, 1.0)
    assert svpp.bubble_s == pytest.approx((P - 1) * 3.0 / 8)


def test_no_pipeline_has_no_bubble():
    assert pipeline_time("1f1b", 1, 4, 1, 1, 1.0, 2.0, 1.0).bubble_s == 0.0


def test_activation_in_flight_on_stage_0():
    assert in_flight_microbatches("1f1b", P, M, 1, 1) == P
    assert in_flight_microbatches("1f1b", P, M, 1, 1, stage=P - 1) == 1
    assert in_flight_microbatches("gpipe", P, M, 1, 1) == M
    assert in_flight_microbatches("zb-h1", P, M, 1, 1) == P
    assert in_flight_microbatches("zb-v", P, M, 2, 1) == P
    assert in_flight_microbatches("interleaved", P, M, 2, 1) == pytest.approx(P + (P - 1) / 2)
    assert in_flight_microbatches("interleaved", P, M, 1, 1) == P  # v = 1 is plain 1F1B
    assert in_flight_microbatches("1f1b", P, 3, 1, 1) == 3  # never more than m


def test_slice_level_memory_relative_to_1f1b_matches_mepipe():
    """MEPipe (EuroSys'25): (p + k - 1)/(k p) = 0.344 at p = 8, k = 4."""
    relative = in_flight_microbatches("seq1f1b", 8, M, 1, 4) / 8
    assert relative == pytest.approx(0.34375)
    svpp = in_flight_microbatches("svpp", 8, M, 2, 4) / 8
    assert svpp == pytest.approx((3 * 8 + 4 - 2) / (2 * 4 * 8))
    assert in_flight_microbatches("svpp", 8, M, 2, 4, cap=8) == pytest.approx(8 / 8)


def test_pipeline_sends_per_micro_batch():
    assert p2p_messages("1f1b", 1, 1) == 1
    assert p2p_messages("interleaved", 3, 1) == 3
    assert p2p_messages("zb-v", 1, 1) == 2
    assert p2p_messages("svpp", 2, 4) == 8


def test_svpp_with_one_chunk_holds_what_seq1f1b_holds():
    from legato.cost.pipeline import in_flight_microbatches
    from legato.schedule import build_schedule, simulate
    from legato.schedule.costs import CostModel

    p, m, k = 4, 8, 4
    predicted = in_flight_microbatches("svpp", p, m, 1, k)
    assert predicted == in_flight_microbatches("seq1f1b", p, m, 1, k) == (p + k - 1) / k
    simulated = simulate(build_schedule("svpp", stages=p, microbatches=m, slices=k), CostModel())
    assert max(simulated.peak_fraction) * p == predicted  # fraction of 1F1B's p micro-batches


@pytest.mark.parametrize(
    ("p", "m", "v", "k"), [(4, 8, 2, 2), (4, 16, 2, 4), (8, 16, 2, 2), (4, 8, 1, 2), (8, 16, 4, 2)]
)
def test_capped_svpp_bubble_tracks_the_simulator(p, m, v, k):
    """A cap below the default costs bubble; the closed form's extra time stays within
    35% of the simulator's makespan (t_f = t_w = 1, t_b = 2: the builder's unit costs),
    is zero at the default cap and grows as the cap shrinks."""
    from legato.schedule import simulate
    from legato.schedule.builders import default_memory_cap, memory_floor, svpp

    floor, default = memory_floor(v, k), default_memory_cap(p, v, k)
    uncapped = simulate(svpp(p, m, v, k)).makespan
    base = pipeline_time("svpp", p, m, v, k, 1.0, 2.0, 1.0)
    assert pipeline_time("svpp", p, m, v, k, 1.0, 2.0, 1.0, cap=default) == base
    previous = base.bubble_s
    for cap in sorted({floor, (floor + default) // 2}, reverse=True):
        model = pipeline_time("svpp", p, m, v, k, 1.0, 2.0, 1.0, cap=cap)
        simulated = simulate(svpp(p, m, v, k, memory_cap=cap)).makespan
        predicted = uncapped + model.bubble_s - base.bubble_s
        assert predicted == pytest.approx(simulated, rel=0.35)
        assert model.bubble_s >= previous
        previous = model.bubble_s


def test_an_uneven_split_is_priced_as_the_runtime_builds_it() -> None:
    """3 layers on pp=2: the cost model's stages hold 2 and 1 layers, as
    ``parallel.pipeline.split_layers`` builds them."""
    from legato.cost.stage import pipeline_stages
    from legato.parallel.pipeline.stages import split_layers
    from legato.specs.model import ModelSpec
    from legato.specs.strategy import Strategy

    spec = ModelSpec(name="u", hidden_size=64, num_layers=3, num_heads=2, num_kv_heads=2,
                     vocab_size=256, seq_len=64)  # fmt: skip
    s = Strategy(pp=2, dp=1, mbs=1, gbs=4)
    s.check(spec, 2)
    stages = pipeline_stages(spec, s)
    assert [st.dense for st in stages] == [len(r) for r in split_layers(3, 2)] == [2, 1]
    assert stages[0].first and stages[1].last


@pytest.mark.parametrize("p", [2, 4, 6, 8, 12, 16])
def test_dualpipe_closed_form_equals_the_simulator(p: int) -> None:
    """The closed form is the simulated makespan of DualPipe's order over a grid of
    micro-batch counts and unequal forward, input- and weight-gradient times (w = 0
    included), not only at f = b = w."""
    import random

    from legato.cost.pipeline import dualpipe_bubble
    from legato.schedule import build_schedule, simulate
    from legato.schedule.costs import CostModel

    rng = random.Random(p)
    grid = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0), (3, 1, 2), (1, 3, 0.2)]
    grid += [tuple(rng.uniform(0.05, 3) for _ in range(3)) for _ in range(12)]
    for m in (2 * p, 2 * p + 2, 4 * p):
        s = build_schedule("dualpipe", stages=p, microbatches=m)
        for f, b, w in grid:
            simulated = simulate(s, CostModel(f=f, b=b, w=w)).makespan
            closed = pipeline_time("dualpipe", p, m, 2, 1, f, b + w, w)
            assert closed.total_s == pytest.approx(simulated, rel=1e-9), (m, f, b, w)
            assert closed.bubble_s == pytest.approx(dualpipe_bubble(p, f, b, w))
        assert in_flight_microbatches("dualpipe", p, m, 2, 1) * 2 == p + 1


def test_dualpipe_bubble_is_below_zero_bubble_h1_and_1f1b():
    for f, b, w in [(1, 1, 1), (1, 2, 1), (1, 1, 0.3)]:
        dual = pipeline_time("dualpipe", P, M, 2, 1, f, b + w, w).bubble_s
        assert dual < pipeline_time("zb-h1", P, M, 1, 1, f, b + w, w).bubble_s
        assert dual < pipeline_time("1f1b", P, M, 1, 1, f, b + w, w).bubble_s


def test_zb_v_is_a_v_of_two_chunks_whether_or_not_vpp_says_so() -> None:
    from legato.cost import predict
    from legato.specs import load_cluster, load_model
    from legato.specs.strategy import Strategy

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1)
    plain = predict(model, cluster, Strategy.parse("pp=8,gbs=64,schedule=zb-v"))
    two = predict(model, cluster, Strategy.parse("pp=8,gbs=64,schedule=zb-v,vpp=2"))
    assert plain.to_dict() == two.to_dict()
