"""Leave-one-source-out fitting and plan ranking on the calibration sets.

Small subsets and few evaluations keep it fast; the full fit is the benchmark
(``benchmarks/cost_model_accuracy.py --held-out``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from legato.cost.calibration import CALIBRATION
from legato.cost.held_out import (
    PRIOR_VALUES,
    constants_of,
    fit_constants,
    leave_one_source_out,
    with_constants,
)
from legato.cost.published import evaluate, load_cases, read_rows
from legato.cost.ranking import rank_groups, summary


@pytest.fixture(scope="module")
def cases():
    accepted, rejected = load_cases()
    assert not rejected, [(r.row["row_id"], r.reason) for r in rejected[:3]]
    return accepted


def test_every_calibration_row_is_accepted(cases):
    """Published runs, MosaicML's FSDP table and vTrain's sweep (1F1B with fewer
    micro-batches than stages, a vocabulary tp does not divide) all predict."""
    assert len(cases) == len(read_rows()) == 33 + 139 + 1440
    families = {c.family for c in cases}
    assert {"MosaicML", "vTrain"} <= families and len(families) == 7


def _sample(cases, per_family=4):
    seen: dict[str, int] = {}
    picked = []
    for c in cases:
        if seen.get(c.family, 0) < per_family and c.family in ("vTrain", "MosaicML", "torchtitan"):
            seen[c.family] = seen.get(c.family, 0) + 1
            picked.append(c)
    return picked


def _with_values(cases, values):
    return [replace(c, row={**c.row, "value": str(v)}) for c, v in zip(cases, values, strict=True)]


def test_the_fit_recovers_a_known_calibration(cases):
    """Rows whose 'published' values are predictions under other constants: the fit
    (from the priors) brings the error from the start's down to under 1%."""
    sample = _sample(cases)
    moved = {**PRIOR_VALUES, "peak_fraction": 0.6, "launch_s": 20e-6}  # two off the priors
    truth = with_constants(CALIBRATION, moved)
    synthetic = _with_values(sample, [r.predicted for r in evaluate(truth, sample)])
    fit = fit_constants(synthetic, max_evaluations=150)
    start_error = max(r.error for r in evaluate(CALIBRATION, synthetic))
    assert start_error > 0.05
    assert fit.error < 0.01
    assert constants_of(fit.calibration)["peak_fraction"] == pytest.approx(0.6, abs=0.03)


def test_a_held_out_source_never_reaches_its_fit(cases):
    """Scrambling the held-out source's measurements leaves its fold's constants as they
    were: only the other sources are fitted on."""
    sample = _sample(cases)
    folds = leave_one_source_out(sample, max_evaluations=20)
    assert [f.family for f in folds] == ["torchtitan", "MosaicML", "vTrain"]
    scrambled = [
        replace(c, row={**c.row, "value": str(3 * float(c.row["value"]))})
        if c.family == "vTrain"
        else c
        for c in sample
    ]
    again = {f.family: f for f in leave_one_source_out(scrambled, max_evaluations=20)}
    assert again["vTrain"].fit.calibration == folds[2].fit.calibration
    assert again["MosaicML"].fit.calibration != folds[1].fit.calibration
    held = again["vTrain"].results
    assert [r.case.family for r in held] == ["vTrain"] * 4
    assert all(r.ratio < 0.5 for r in held)  # scored against the scrambled values


def test_without_h100_rows_the_h100_fraction_is_the_a100_one(cases):
    a100 = [c for c in _sample(cases) if c.family == "vTrain"]
    fit = fit_constants(a100, max_evaluations=20)
    values = constants_of(fit.calibration)
    assert values["h100_fraction"] == values["peak_fraction"]


def test_ranking_against_the_measured_order(cases):
    """A group whose measurements are the predictions ranks perfectly; reversing the
    measured order makes Spearman -1 and the pick the measured worst."""
    first = next(c for c in cases if c.family == "vTrain")

    def job(c):
        return c.strategy.gbs, c.cluster.world_size, c.model.hidden_size, c.model.num_layers

    group = [c for c in cases if c.family == "vTrain" and job(c) == job(first)]
    results = evaluate(CALIBRATION, group)
    steps = [r.step_s for r in results]
    assert len(set(steps)) == len(steps)  # no ties: the reversed order is exact
    exact = rank_groups(evaluate(CALIBRATION, _with_values(group, steps)))
    assert len(exact) == 1 and exact[0].plans == len(group) >= 3
    assert exact[0].spearman == pytest.approx(1.0) and exact[0].regret == pytest.approx(0.0)
    order = sorted(steps)
    reversed_steps = [order[-1 - order.index(t)] for t in steps]  # fastest measured slowest
    flipped = rank_groups(evaluate(CALIBRATION, _with_values(group, reversed_steps)))[0]
    assert flipped.spearman == pytest.approx(-1.0)
    assert flipped.regret == pytest.approx(1 - order[0] / order[-1])
    assert summary([flipped])["picks_within_5pct"] == 0.0
