"""Capture and restore every random generator of a process as JSON.

Resuming must continue the same random streams (dropout, router noise, anything a user
adds), and each rank has its own. JSON rather than pickle so that loading a checkpoint
never executes code from the file.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Python, numpy, torch CPU and (when ``device`` is a GPU) its CUDA generator states."""
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(keys), gauss],
        "numpy": [name, np_keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _encode(torch.get_rng_state()),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = _encode(torch.cuda.get_rng_state(device))
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    name, np_keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(np_keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_decode(state["torch"]))
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(_decode(state["cuda"]), device)
