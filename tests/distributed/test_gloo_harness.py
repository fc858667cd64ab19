"""The gloo test harness returns each rank's result, and a worker's failed assertion comes
back as that failure (never as the retried TeardownAbort)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessRaisedException

from gloo_harness import run_ranks

pytestmark = pytest.mark.distributed


def _sum_then_check(rank: int, wrong_rank: int) -> float:
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    assert rank != wrong_rank, f"rank {rank} disagrees"
    return total.item() + rank


def test_results_in_rank_order_and_failures_as_they_are() -> None:
    assert run_ranks(_sum_then_check, -1) == [3.0, 4.0]
    with pytest.raises(ProcessRaisedException, match="rank 1 disagrees"):
        run_ranks(_sum_then_check, 1, timeout_s=30)
