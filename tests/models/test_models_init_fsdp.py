"""init_weights on FSDP2-sharded DTensor parameters (meta build -> fully_shard -> to_empty ->
init_weights) gives, on every rank, exactly the shards of the eager model of that seed."""

from __future__ import annotations

import pytest
import torch

from gloo_harness import run_ranks
from legato.models import build_model
from legato.specs.model import ModelSpec, MoESpec

pytestmark = pytest.mark.distributed

# Odd sizes so that some dimension-0 shards are uneven (FSDP2 pads them).
SPEC = ModelSpec(
    name="fsdp-init",
    hidden_size=24,
    num_layers=2,
    num_heads=3,
    vocab_size=37,
    seq_len=8,
    qk_norm=True,
    moe=MoESpec(num_experts=3, top_k=2, expert_ffn_hidden_size=10, router_score="sigmoid"),
)


def _worker(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = build_model(SPEC, device="meta")
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights(21)
    eager = build_model(SPEC, seed=21)
    reference = eager.state_dict()
    for key, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        assert torch.equal(full, reference[key]), key
    ids = torch.randint(0, SPEC.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(ids), eager(ids))


def test_init_weights_on_fsdp2_sharded_model():
    run_ranks(_worker)
