"""Data-parallel gathers and reductions as they happen: exposure unit by unit, runtime
profiles, and the terms of a prediction adding up to its step."""

from __future__ import annotations

import pytest

from legato.cost.param_overlap import Unit, bucket_ends, issue_anchors, run_pass
from legato.cost.published import evaluate, load_cases
from legato.cost.runtime import Runtime, parse_runtime
from legato.cost.runtime_profiles import profile_evidence, profile_names
from legato.cost.training_step import predict
from legato.errors import ConfigError
from legato.specs.registry import load_cluster, load_model
from legato.specs.strategy import Strategy


def test_gather_longer_than_compute_exposes_the_difference_layer_by_layer():
    units = [Unit(compute_s=1.0, gather_s=3.0)] * 4
    t = run_pass(units, issue_anchors(units, prefetch_units=1))
    # the first gather, then each next gather (3 s) behind a 1 s compute: 3 + 3 * 3 + 1
    assert t.seconds == pytest.approx(13.0)
    assert t.exposed_s == pytest.approx(9.0)
    assert t.hidden_s == pytest.approx(3.0)  # one compute second behind each later gather


def test_hidden_never_exceeds_the_compute_it_hides_behind():
    units = [Unit(compute_s=c, gather_s=g, reduce_s=r) for c, g, r in
             [(0.5, 2.0, 1.0), (2.0, 0.1, 0.1), (0.1, 1.5, 0.7), (1.0, 0.2, 0.0)]]  # fmt: skip
    for depth in (1, 2, 4):
        t = run_pass(units, issue_anchors(units, depth))
        assert t.hidden_s <= t.compute_s + 1e-12
        assert t.seconds >= max(t.compute_s, t.comm_s) - 1e-12


def test_short_gathers_hide_but_the_last_reduction_does_not():
    units = [Unit(compute_s=1.0, gather_s=0.2, reduce_s=0.3)] * 3
    t = run_pass(units, issue_anchors(units, 1))
    assert t.exposed_s == pytest.approx(0.2 + 0.3)  # the first gather, the last reduction


def test_prefetch_by_parameters_counts_what_is_in_flight():
    units = [Unit(1.0, 1.0, 0.0, numel) for numel in (10, 10, 10, 100, 10)]
    # unit 0's fetch prefetches units 1-3 (10, then 20 in flight, both below 25); unit 4
    # waits until unit 3's fetch, when nothing else is in flight
    assert issue_anchors(units, prefetch_numel=25) == [-1, 0, 0, 0, 3]
    assert bucket_ends([10, 10, 10, 100, 10], 25) == [0, 0, 30, 100, 10]


def test_runtime_profiles_cite_every_behaviour_and_reject_unknown_names():
    for name in profile_names():
        evidence = profile_evidence(name)
        assert evidence and all(len(text) > 20 for text in evidence.values())
        parse_runtime({"profile": name})  # every value is a valid Runtime field
    runtime = parse_runtime("profile=deepspeed-zero,prefetch_numel=1000")
    assert (runtime.param_unit, runtime.prefetch_numel) == ("param", 1000)
    with pytest.raises(ConfigError, match="unknown runtime profile 'fsdp3'"):
        parse_runtime("profile=fsdp3")


def _gpt3_zero3(runtime: Runtime):
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100", nodes=96)
    strategy = Strategy(dp=768, zero=3, mbs=1, gbs=1536, recompute="full", dtype="fp16")
    return predict(model, cluster, strategy, runtime=runtime)


@pytest.mark.parametrize(
    "runtime", [Runtime(), parse_runtime("profile=deepspeed-zero"), parse_runtime("profile=fsdp1")]
)
def test_terms_add_up_to_the_predicted_step(runtime):
    p = _gpt3_zero3(runtime)
    b = p.breakdown
    terms = (b["compute_s"] + b["recompute_s"] + b["contention_s"] + b["bubble_s"]
             + b["optimizer_s"] + sum(b["exposed_comm_s"].values()))  # fmt: skip
    assert terms == pytest.approx(p.step_time_s, rel=1e-9)
    assert sum(b["compute_by_class_s"].values()) == pytest.approx(b["compute_s"], rel=1e-9)
    for line in b["overlap"]:
        assert line["hidden_s"] + line["exposed_s"] == pytest.approx(line["comm_s"])
    assert b["contention_s"] > 0  # what hides slows the compute it hides behind


def test_deepspeed_per_parameter_gathers_expose_more_than_fsdp_blocks():
    fsdp = _gpt3_zero3(parse_runtime("profile=fsdp2"))
    deepspeed = _gpt3_zero3(parse_runtime("profile=deepspeed-zero"))
    assert deepspeed.breakdown["exposed_comm_s"]["dp"] > fsdp.breakdown["exposed_comm_s"]["dp"]


def test_torchtitan_llama2_70b_that_ran_is_predicted_to_fit():
    cases = [c for c in load_cases()[0] if c.family == "torchtitan"]
    for result in evaluate(cases=cases):
        assert result.fits, result.case.row["row_id"]
