"""Fit every device preset's profile on the published micro-benchmarks, report each law's
error on held-out micro rows, and (``--write``) regenerate ``src/legato/devices/profiles/``.

Reads ``../shared/calibration/micro/`` (``--micro DIR``) and vTrain's A100 nccl-tests logs
beside it; no end-to-end run is read. One JSON line per (device, law): the fitted constants'
held-out median and mean absolute error in percent (``value`` is the median), whether the
law is fitted, transferred from the same silicon or a datasheet prior, and its evidence.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from legato.devices.fit_profiles import fit_all, vtrain_logs
from legato.devices.profile import DeviceProfile
from legato.devices.profile_file import render_profile
from report import emit

BENCHMARK = "device_profiles"
ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT.parent / "shared" / "calibration" / "micro"
OUT = ROOT / "src" / "legato" / "devices" / "profiles"


def _laws(profile: DeviceProfile):
    yield from ((f"gemm.{d}", law) for d, law in profile.gemm.items())
    yield from ((f"attention.{d}", law) for d, law in profile.attention.items())
    yield from (("memory", profile.memory), ("host_link", profile.host_link))
    yield ("host.launch", profile.host)
    yield ("host.step", dataclasses.replace(profile.host, fit=profile.host.step_fit))
    yield from ((f"collectives.{lv}", law) for lv, law in profile.collectives.items())


def _constants(law) -> dict:
    return {f.name: getattr(law, f.name) for f in dataclasses.fields(law)
            if isinstance(getattr(law, f.name), float)}  # fmt: skip


def report(profiles: dict[str, DeviceProfile]) -> None:
    for device, profile in profiles.items():
        for name, law in _laws(profile):
            fit = law.fit
            kind = "fitted" if fit.fitted else (
                "transferred" if fit.evidence.startswith("transferred") else "prior")  # fmt: skip
            emit(BENCHMARK, case={"device": device, "law": name}, metric="held_out_abs_pct_error",
                 value=fit.held_out_median_pct, mean_abs_pct_error=fit.held_out_mean_pct,
                 status=kind, constants=_constants(law), evidence=fit.evidence)  # fmt: skip


HEADER = [
    "Device profile: the time of each kind of work on this device (docs/cost_model.md).",
    "Written by `benchmarks/fit_device_profiles.py --write` from the published",
    "micro-benchmarks of ../shared/calibration/micro/ (its README names every source and",
    "licence); our own derived constants. `fit.fitted = false`: a datasheet prior or a law",
    "transferred from the same silicon. Replace any law with your own measurements.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=Path, default=MICRO, help="micro-benchmark folder")
    parser.add_argument("--write", action="store_true", help="rewrite the shipped profiles")
    args = parser.parse_args(argv)
    if not args.micro.is_dir():
        raise SystemExit(f"{args.micro}: no micro-benchmark folder (see its README in shared/)")
    profiles = fit_all(args.micro, {"a100-80g": vtrain_logs(args.micro.parent)})
    report(profiles)
    if args.write:
        for device, profile in profiles.items():
            (OUT / f"{device}.toml").write_text(render_profile(profile, HEADER), encoding="utf-8")


if __name__ == "__main__":
    main()
