"""Per-kind collective fits of a measured host: each kind keeps its own latency and
bandwidth (gloo's differ by kind), they survive the side file, and the cost model uses
them for that kind only."""

from __future__ import annotations

import json

import pytest

from legato.calibrate.cluster_file import collective_fits
from legato.cost.calibration import load_calibration
from legato.cost.collectives import collective_time
from legato.devices.collectives import LEVELS, ideal_time
from legato.devices.link_fit import CommTiming
from legato.devices.profile_file import render_profile
from legato.devices.registry import shipped_profile
from legato.errors import ConfigError
from legato.specs.device import Link
from legato.specs.typed import tomllib


def _timings(kind: str, latency_s: float, bandwidth: float) -> list[CommTiming]:
    """Exact alpha-beta times of ``kind`` on 2 ranks at three sizes (the ring formulas of
    ``steps_and_wire_bytes``)."""
    from legato.cost.collectives import steps_and_wire_bytes

    out = []
    for nbytes in (4 << 10, 256 << 10, 4 << 20):
        steps, wire = steps_and_wire_bytes(kind, nbytes, 2)
        out.append(CommTiming(kind, nbytes, 2, steps * latency_s + wire / bandwidth))
    return out


def test_each_kind_recovers_its_own_link() -> None:
    timings = _timings("all_reduce", 1e-3, 2e9) + _timings("all_to_all", 3e-4, 1e9)
    fits = {kind: (lat, gbps) for kind, lat, gbps in collective_fits(timings)}
    assert fits["all_reduce"] == pytest.approx((1000.0, 2.0), rel=1e-3)
    assert fits["all_to_all"] == pytest.approx((300.0, 1.0), rel=1e-3)


def _side(tmp_path, kinds: dict) -> object:
    """A side file whose host profile has the per-kind fits ``kinds`` on every level."""
    level = {"bus_fraction": 1.0, "call_latency_us": 0.0, "algorithm": "alpha_beta",
             "kinds": kinds}  # fmt: skip
    profile = tomllib.loads(render_profile(shipped_profile("cpu"), []))
    profile["collectives"] = dict.fromkeys(LEVELS, level)
    side = tmp_path / "host.calibration.json"
    side.write_text(json.dumps({"calibration": {}, "profile": profile}))
    return side


def test_the_cost_model_uses_a_fit_for_its_kind_only(tmp_path) -> None:
    calibration = load_calibration(_side(tmp_path, {"all_reduce": [1000, 2.0]}))
    profile = calibration.profile
    assert profile.collectives["intra_node"].kinds == {"all_reduce": (1000.0, 2.0)}
    link = Link(name="slow", bandwidth_gbps=0.5, latency_us=50.0)
    fitted = collective_time("all_reduce", 4 << 20, 2, link, profile)
    assert fitted == pytest.approx(2 * 1e-3 + 2 * (4 << 20) / 2 / 2e9)
    plain = collective_time("all_gather", 4 << 20, 2, link, profile)  # the link's figures
    assert plain == pytest.approx(ideal_time("all_gather", 4 << 20, 2, 50e-6, 0.5e9))


def test_a_bad_fit_row_is_one_line(tmp_path) -> None:
    side = _side(tmp_path, {"all_reduce": ["fast"]})
    with pytest.raises(
        ConfigError, match=r"kinds.all_reduce: expected \[latency_us, bandwidth_gbps"
    ):
        load_calibration(side)
