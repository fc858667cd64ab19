"""The cost model's constants that are not the device's, in one place.

What a device does (GEMMs by shape, attention, streaming kernels, collectives per link
level, host launch cost) is its profile's (``legato.devices``: fitted on micro-benchmarks
only, never on end-to-end runs). What is left here is counted or typical, stated at each
field. ``profile`` replaces the device's shipped profile: a host ``legato calibrate``
measured, or a user's own measurements.

``load_calibration`` reads such constants back: a JSON object of ``Calibration`` fields
(those missing keep ``CALIBRATION``'s values; ``profile`` a path to a profile file,
relative to the JSON file), or a ``legato calibrate`` side file whose ``"calibration"``
entry is that object and whose ``"profile"`` entry is the host's profile (a side file
with measurements and no profile was written by an older ``legato calibrate``: an error);
``side_path`` names the side file of a cluster file, ``calibration_beside`` loads it when
it is there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from legato.devices.profile import DeviceProfile
from legato.devices.profile_file import profile_from_dict, read_profile
from legato.devices.registry import profile_for
from legato.errors import ConfigError, SpecError
from legato.specs.device import DeviceSpec
from legato.specs.typed import from_dict, read_table_file


@dataclass(frozen=True)
class Calibration:
    """Constants of the memory model and the host's kernel overhead, and the device
    profile when it is not the device's shipped one."""

    # Bytes moved per parameter by an Adam step: read fp32 master, grad, m, v; write master,
    # m, v and the low-precision copy; gradient zeroing and norm (counted).
    optimizer_bytes_per_param: float = 40.0
    # CUDA context, allocator fragmentation and workspaces: PyTorch on 80 GB GPUs typically
    # keeps 2-4 GiB beyond what tensors need.
    framework_gib: float = 3.0
    # Seconds every eager kernel costs beyond its bytes and FLOPs (dispatch, and on a CPU
    # the fork/join of its threads), times ``runtime.kernels_per_pass``. 0: GPU launch
    # costs hide behind the queue (the profile's launch cost is a floor, not an addition);
    # ``legato calibrate``'s probe does not measure what a training kernel pays.
    kernel_overhead_s: float = 0.0
    # The device profile to use instead of the device's shipped one (None: shipped).
    profile: DeviceProfile | None = None

    def profile_of(self, device: DeviceSpec) -> DeviceProfile:
        return self.profile or profile_for(device)


CALIBRATION = Calibration()


def load_calibration(path: str | Path) -> Calibration:
    """The constants in JSON file ``path`` over ``CALIBRATION``'s; ConfigError (one line,
    naming the key) for an unknown field or a bad value."""
    data = read_table_file(path, ConfigError)
    profile = None
    if "calibration" in data:  # a ``legato calibrate`` side file: a CPU host's measurements
        if "measurement" in data and "profile" not in data:  # an older calibrate's file
            raise ConfigError(f"{path}: written by an older `legato calibrate` (no device "
                              "profile); run `legato calibrate` again")  # fmt: skip
        profile = data.get("profile")
        data = data["calibration"]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: calibration must be a JSON object of Calibration fields")
    data = dict(data)
    profile = data.pop("profile", profile)
    calibration = from_dict(Calibration, data, f"{path}: calibration", ConfigError)
    if profile is None:
        return calibration
    try:
        if isinstance(profile, str):
            loaded = read_profile(Path(path).parent / profile)
        elif isinstance(profile, dict):
            loaded = profile_from_dict(profile, f"{path}: profile")
        else:
            raise SpecError(f"{path}: profile must be a file name or a table")
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    return replace(calibration, profile=loaded)


SIDE_SUFFIX = ".calibration.json"


def side_path(cluster_file: str | Path) -> Path:
    """Where ``legato calibrate`` puts the measurements and constants of ``cluster_file``."""
    path = Path(cluster_file)
    return path.with_name(path.stem + SIDE_SUFFIX)


def calibration_beside(cluster_file: str | Path) -> Calibration | None:
    """The constants ``legato calibrate`` wrote beside ``cluster_file``, or None when it is
    not such a file (a preset name, a file without a side file)."""
    path = Path(cluster_file)
    side = side_path(path)
    if not (path.suffix == ".toml" and path.is_file() and side.is_file()):
        return None
    return load_calibration(side)
