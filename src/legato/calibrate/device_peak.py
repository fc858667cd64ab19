"""Peak FLOP/s of the device a rank trains on: the denominator of MFU.

GPUs have datasheet peaks in the device presets. A CPU has none worth trusting (cores,
vector width, clocks and thread count all vary), so its peak is measured once with a
short matrix-multiply calibration (``calibrate.matmul.matmul_peak``), a few hundred
milliseconds. It is measured on one thread and scaled by the trainer's thread count: a
multi-threaded matmul on a shared machine measures how often its slowest thread is
interrupted, not what the cores can do.
"""

from __future__ import annotations

import functools

import torch

from legato.calibrate.matmul import matmul_peak
from legato.errors import SpecError


def datasheet_peak(device: torch.device, dtype: str) -> float | None:
    """The preset peak of a known GPU model (matched by its name), else None."""
    if device.type != "cuda":
        return None
    from legato.specs.registry import list_devices, load_device

    name = torch.cuda.get_device_name(device).lower().replace(" ", "")
    for preset in list_devices():
        if preset.split("-")[0] in name:
            try:
                return load_device(preset).peak_flops(dtype)
            except SpecError:
                return None
    return None


@functools.cache
def cpu_peak_flops(dtype: str, threads: int) -> float:
    """One thread's measured peak times ``threads`` (cached: calibrate once per process)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return threads * matmul_peak(torch.device("cpu"), dtype)
    finally:
        torch.set_num_threads(previous)


def peak_flops(device: torch.device, dtype: str) -> tuple[float, str]:
    """(FLOP/s of one device, where the number comes from: 'datasheet' or 'measured').

    FP8 training dtypes ('fp8', 'fp8-rowwise') use the device's fp8 datasheet peak. Where
    there is none (a CPU, an unknown GPU) the peak is measured for the dtype the FP8 GEMMs
    really run in there: fp32 (the emulated backend dequantises and multiplies in fp32).
    """
    fp8 = dtype.startswith("fp8")
    measured_dtype = "fp32" if fp8 else dtype
    if device.type == "cpu":
        return cpu_peak_flops(measured_dtype, torch.get_num_threads()), "measured"
    peak = datasheet_peak(device, "fp8" if fp8 else dtype)
    if peak is not None:
        return peak, "datasheet"
    return matmul_peak(device, measured_dtype, size=4096), "measured"
