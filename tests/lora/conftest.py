"""LoRA tests run their tiny models on one intra-op thread.

The models here are a few thousand parameters: a second thread buys nothing, and on a
loaded machine OpenMP's spinning workers made the same test 15x slower (40 s vs 2.8 s).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
