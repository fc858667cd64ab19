"""Activation swap under FSDP2 (2 gloo processes): the same gradients as without swap, and
FSDP2's unsharded parameters are never copied to the host."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gloo_harness import run_ranks
from legato.memory import ActivationSwap, SavedBytes
from legato.models import build_model
from legato.specs import load_model

pytestmark = pytest.mark.distributed


def _grads(rank: int, swap: bool) -> tuple[list[torch.Tensor], SavedBytes]:
    spec = load_model("tiny").with_(num_layers=3, vocab_size=258, seq_len=32)
    model = build_model(spec, seed=0)
    mesh = init_device_mesh("cpu", (2,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    stats = SavedBytes()
    if swap:  # after fully_shard, as documented
        ActivationSwap(model.blocks, stats=stats, min_bytes=0)
    ids = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(rank))
    F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    return [p.grad.full_tensor() for p in model.parameters()], stats


def _worker(rank: int) -> dict:
    plain, _ = _grads(rank, swap=False)
    swapped, stats = _grads(rank, swap=True)
    params = sum(p.numel() * p.element_size() for p in plain)
    return {
        "equal": all(torch.equal(a, b) for a, b in zip(plain, swapped, strict=True)),
        "to_host": stats.to_host,
        "host_left": stats.host,
        "params_bytes": params,
    }


def test_swap_composes_with_fsdp2() -> None:
    result = run_ranks(_worker)[0]
    assert result["equal"]
    assert result["to_host"] > 0 and result["host_left"] == 0
    # activations of 2 x 32 tokens, 3 blocks: far less than one copy of the weights
    assert result["to_host"] < result["params_bytes"]
