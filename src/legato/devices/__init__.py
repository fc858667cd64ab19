"""Device profiles: the time of each kind of work on one device, fitted on micro-benchmarks.

Torch-free and below ``cost/``: the training cost model, the serving simulator and the
cluster simulator price their work through ``DeviceProfile``; the fitting code
(``fit_*``, ``gemm_fit``, ``link_fit``) and the readers of measurements (``micro``,
``nccl_tests``) live here too, so ``legato calibrate`` only measures.
"""

from legato.devices.profile import DeviceProfile
from legato.devices.profile_file import read_profile
from legato.devices.registry import profile_for, shipped_profile

__all__ = ["DeviceProfile", "profile_for", "read_profile", "shipped_profile"]
