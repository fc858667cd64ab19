"""Uniform-cost simulations reproduce the note's closed forms exactly.

Cost convention (``CostModel``): f, b, w are per micro-batch per rank; default
f = b = w = 1, so a fused BW costs 2 F (t_b = 2 t_f). Two bubble definitions:
``bubble_ratio`` = idle / makespan (the 1F1B and Seq1F1B formulas) and
``bubble_vs_ideal`` = idle / compute (the interleaved and zero-bubble formulas).
"""

from __future__ import annotations

import pytest

from legato.schedule import (
    CostModel,
    default_memory_cap,
    gpipe,
    interleaved,
    one_f_one_b,
    seq1f1b,
    simulate,
    svpp,
    zb_h1,
    zb_v,
)

GRID = [(2, 1), (2, 5), (4, 2), (4, 4), (4, 8), (8, 16), (5, 7)]
COSTS = [CostModel(), CostModel(b=0.5, w=0.5), CostModel(f=1.0, b=2.3, w=0.4)]


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("costs", COSTS, ids=["tb=2tf", "tb=tf", "odd"])
def test_1f1b_and_gpipe_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m, costs) -> None:
    # exact for any t_f : t_b ratio, not only t_b = 2 t_f or t_f = t_b
    expected = (p - 1) / (m + p - 1)
    for build in (one_f_one_b, gpipe):
        r = simulate(build(p, m), costs)
        assert r.bubble_ratio == pytest.approx([expected] * p, abs=1e-12)
        assert r.makespan == pytest.approx((m + p - 1) * (costs.f + costs.b + costs.w))


@pytest.mark.parametrize(("p", "m"), GRID)
def test_1f1b_peak_is_p_microbatches_on_stage_0(p, m) -> None:
    r = simulate(one_f_one_b(p, m))
    assert r.peak_units == tuple(float(min(p - d, m)) for d in range(p))
    assert simulate(gpipe(p, m)).peak_units == (float(m),) * p


@pytest.mark.parametrize(
    ("p", "m", "v"), [(2, 2, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2), (3, 9, 3)]
)
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal(p, m, v) -> None:
    for costs in COSTS[:2]:
        r = simulate(interleaved(p, m, v), costs)
        assert r.bubble_vs_ideal == pytest.approx([(p - 1) / (v * m)] * p, abs=1e-12)
    if m > p:  # Megatron warm-up 2(p-1) + (v-1)p on rank 0, plus the one in the steady state
        assert r.peak_units[0] == (v + 1) * p - 1


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 8), (8, 16), (3, 10)])
def test_zb_h1_bubble_is_a_third_of_1f1b_at_1f1b_memory(p, m) -> None:
    # T_F = T_B = T_W: bubble (p-1)(T_F + T_B - T_W) = (p-1), ideal 3m  ->  (p-1)/(3m)
    r = simulate(zb_h1(p, m))
    assert r.bubble_vs_ideal == pytest.approx([(p - 1) / (3 * m)] * p, abs=1e-12)
    assert max(r.peak_fraction) == 1.0


def test_zb_h1_formula_needs_m_at_least_p() -> None:
    # with m < p the pipeline never fills: at p=4, m=2 the exact value is 5/6, not 1/2
    r = simulate(zb_h1(4, 2))
    assert max(r.bubble_vs_ideal) == pytest.approx(5 / 6)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (8, 16)])
def test_zb_v_reaches_the_v_shape_floor_at_1f1b_memory(p, m) -> None:
    # "~0": the only idle left is the last rank waiting for the first micro-batch's
    # p-1 half-stage forwards, (p-1)/2 of 3m -> (p-1)/(6m), exact at these sizes
    r = simulate(zb_v(p, m))
    assert max(r.bubble_vs_ideal) == pytest.approx((p - 1) / (6 * m), abs=1e-12)
    assert max(r.peak_fraction) <= 1.0
    assert max(r.bubble_ratio) < max(simulate(zb_h1(p, m)).bubble_ratio)


@pytest.mark.parametrize(("p", "m", "k"), [(4, 4, 2), (4, 8, 4), (8, 16, 4), (8, 16, 2), (3, 5, 3)])
def test_seq1f1b_bubble_and_peak(p, m, k) -> None:
    r = simulate(seq1f1b(p, m, k))
    assert r.bubble_ratio == pytest.approx([(p - 1) / (k * m + p - 1)] * p, abs=1e-12)
    assert r.peak_fraction[0] == pytest.approx((p + k - 1) / (k * p))


def test_seq1f1b_peak_is_0_344_of_1f1b_at_p8_k4() -> None:
    assert simulate(seq1f1b(8, 16, 4)).peak_fraction[0] == 0.34375


def test_svpp_relative_activation_and_bubble_at_p8_m16() -> None:
    p, m, v, k = 8, 16, 2, 4
    r = simulate(svpp(p, m, v, k))
    # default cap = the note's ((v+1)p + k - 2) units: 26/64 of 1F1B's stage-0 peak
    assert r.peak_fraction[0] == ((v + 1) * p + k - 2) / (v * k * p) == 0.40625
    # bubble: only the last rank's wait for p-1 first-slice chunk forwards is left
    assert max(r.bubble_vs_ideal) == pytest.approx((p - 1) / (3 * v * k * m), abs=1e-12)
    # at Seq1F1B's memory ((p+k-1)/(k p) of 1F1B = (p+k-1) v slice-chunk units) SVPP
    # has about a fifth of its bubble
    same_memory = simulate(svpp(p, m, v, k, memory_cap=(p + k - 1) * v))
    seq = simulate(seq1f1b(p, m, k))
    assert max(same_memory.peak_fraction) <= max(seq.peak_fraction)
    assert max(same_memory.bubble_ratio) < max(seq.bubble_ratio) / 4
    assert max(r.bubble_ratio) < max(simulate(interleaved(p, m, v)).bubble_ratio)


@pytest.mark.parametrize(("p", "m"), [(3, 2), (4, 6), (6, 12), (8, 3)])
@pytest.mark.parametrize(("v", "k"), [(1, 1), (1, 4), (2, 2), (3, 2), (2, 4)])
def test_svpp_never_beats_the_startup_floor_and_stays_under_its_cap(p, m, v, k) -> None:
    # the formula is a cap, reached when m is large enough; the last rank cannot start
    # before p-1 first-slice forwards of chunk 0 have run, each f/(v k)
    r = simulate(svpp(p, m, v, k))
    assert max(r.peak_units) <= default_memory_cap(p, v, k)
    assert max(r.bubble_vs_ideal) >= (p - 1) / (3 * v * k * m) - 1e-12
