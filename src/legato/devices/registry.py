"""The profile of a device: its shipped file (``devices/profiles/<name>.toml``) when the
device is a preset, else its datasheet priors."""

from __future__ import annotations

from functools import cache
from importlib import resources

from legato.devices.priors import prior_profile
from legato.devices.profile import DeviceProfile
from legato.devices.profile_file import profile_from_dict
from legato.errors import SpecError
from legato.specs.device import DeviceSpec
from legato.specs.typed import tomllib


def _profiles_dir():
    return resources.files("legato.devices") / "profiles"


def shipped_profiles() -> list[str]:
    """Device names with a shipped profile file."""
    files = _profiles_dir().iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


@cache
def shipped_profile(name: str) -> DeviceProfile | None:
    """The shipped profile of preset ``name``, or None."""
    resource = _profiles_dir() / f"{name}.toml"
    if not resource.is_file():
        return None
    try:
        data = tomllib.loads(resource.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # a packaging bug, not a user error
        raise SpecError(f"profile file {name}.toml is malformed: {exc}") from None
    return profile_from_dict(data, f"profile {name}")


def profile_for(device: DeviceSpec) -> DeviceProfile:
    """``device``'s shipped profile, or its priors (a device of a user's own)."""
    return shipped_profile(device.name) or prior_profile(device)
