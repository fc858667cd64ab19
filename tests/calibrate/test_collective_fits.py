"""Per-kind collective fits of a measured host: each kind keeps its own latency and
bandwidth (gloo's differ by kind), they survive the side file, and the cost model uses
them for that kind only."""

from __future__ import annotations

import json

import pytest

from legato.calibrate.cluster_file import collective_fits
from legato.cost.calibration import CALIBRATION, load_calibration
from legato.cost.collectives import collective_time
from legato.devices.link_fit import CommTiming
from legato.errors import ConfigError
from legato.specs.device import Link


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


def test_the_cost_model_uses_a_fit_for_its_kind_only(tmp_path) -> None:
    side = tmp_path / "host.calibration.json"
    side.write_text(json.dumps({"calibration": {"collective_fits": [["all_reduce", 1000, 2.0]],
                                                "base_latency_us": 0.0}}))  # fmt: skip
    calibration = load_calibration(side)
    assert calibration.collective_fits == (("all_reduce", 1000.0, 2.0),)
    link = Link(name="slow", bandwidth_gbps=0.5, latency_us=50.0)
    fitted = collective_time("all_reduce", 4 << 20, 2, link, calibration)
    want = 2 * 1e-3 + 2 * (4 << 20) / 2 / (2e9 * calibration.bandwidth_fraction)
    assert fitted == pytest.approx(want)
    plain = collective_time("all_gather", 4 << 20, 2, link, calibration)
    assert plain == pytest.approx(collective_time("all_gather", 4 << 20, 2, link, CALIBRATION)
                                  - CALIBRATION.base_latency_us * 1e-6)  # fmt: skip


def test_a_bad_fit_row_is_one_line(tmp_path) -> None:
    side = tmp_path / "bad.calibration.json"
    side.write_text(json.dumps({"calibration": {"collective_fits": [["all_reduce", "fast"]]}}))
    with pytest.raises(ConfigError, match=r"collective_fits\[0\]: expected \[kind, latency_us"):
        load_calibration(side)
