"""Expert parallelism on 2 gloo processes: every overlap schedule equals the single-process
layer (outputs, input and parameter gradients; fp32, torch.testing's default tolerance:
rtol 1.3e-6, atol 1e-5), and EP composes with FSDP2 sharding the dense part."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from gloo_harness import run_ranks
from legato.models import build_model
from legato.models.moe import MoE
from legato.moe import Overlap
from legato.parallel.expert import apply_expert_parallel, expert_parameters
from legato.specs.model import ModelSpec, MoESpec
from legato.specs.strategy import StrategyError

pytestmark = pytest.mark.distributed

BASE = {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "vocab_size": 37, "seq_len": 8}
SPECS = [
    ModelSpec(name="swiglu", moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=8), **BASE),
    ModelSpec(
        name="gelu-bias-sigmoid-shared",
        mlp="gelu",
        bias=True,
        moe=MoESpec(
            num_experts=6,
            top_k=3,
            expert_ffn_hidden_size=12,
            num_shared_experts=1,
            router_score="sigmoid",
        ),
        **BASE,
    ),
]
SCHEDULES = [
    Overlap(),
    Overlap.domino(),
    Overlap.domino(chunks=3, groups=2),
    Overlap.comet(chunks=1, groups=1),
    Overlap.comet(chunks=2, groups=2),
    Overlap.comet(chunks=3, groups=3),
]
TOKENS = (7, 5)  # uneven token counts per rank


def _layer(spec: ModelSpec) -> MoE:
    layer = MoE(spec)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        layer.gate.weight[:, 0] = 0.0
        layer.gate.weight[-1, 0] = -30.0  # with feature 0 = 3, the last expert gets nothing
    return layer


def _tokens(rank: int) -> torch.Tensor:
    x = torch.randn(TOKENS[rank], 16, generator=torch.Generator().manual_seed(rank))
    x[:, 0] = 3.0
    return x


def _full(grad: torch.Tensor) -> torch.Tensor:
    """An expert gradient's full tensor; a replicated parameter's gradient averaged."""
    if hasattr(grad, "full_tensor"):
        return grad.full_tensor()
    grad = grad.clone()
    dist.all_reduce(grad)
    return grad / dist.get_world_size()


def _schedules_worker(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    bad = replace(SPECS[0], moe=replace(SPECS[0].moe, num_experts=3))
    with pytest.raises(StrategyError, match=r"strategy\.ep \(2\) must divide moe\.num_experts"):
        apply_expert_parallel(_layer(bad), mesh)
    for spec in SPECS:
        # Reference: the single-process layer on both ranks' tokens, mean of the losses.
        ref = _layer(spec)
        xs = [_tokens(r).requires_grad_() for r in range(2)]
        grad_outs = [
            torch.randn(TOKENS[r], 16, generator=torch.Generator().manual_seed(9 + r))
            for r in range(2)
        ]
        outs = [ref(x) for x in xs]
        (sum((o * g).sum() for o, g in zip(outs, grad_outs, strict=True)) / 2).backward()
        assert ref.last_expert_counts[-1] == 0
        for overlap in SCHEDULES:
            layer = _layer(spec)
            apply_expert_parallel(layer, mesh, overlap)
            x = _tokens(rank).requires_grad_()
            out = layer(x)
            (out * grad_outs[rank]).sum().backward()
            where = f"{spec.name} {overlap}"
            torch.testing.assert_close(out, outs[rank].detach(), msg=where)
            torch.testing.assert_close(x.grad, xs[rank].grad * 2, msg=where)
            for (name, p), q in zip(layer.named_parameters(), ref.parameters(), strict=True):
                torch.testing.assert_close(_full(p.grad), q.grad, msg=f"{where} {name}")


def test_every_schedule_equals_the_single_process_layer():
    run_ranks(_schedules_worker)


FSDP_SPEC = ModelSpec(
    name="ep-fsdp",
    moe=MoESpec(
        num_experts=4,
        top_k=2,
        expert_ffn_hidden_size=24,
        num_shared_experts=1,
        first_dense_layers=1,
    ),
    **{**BASE, "hidden_size": 32},
)


def _fsdp_worker(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = build_model(FSDP_SPEC, device="meta")
    apply_expert_parallel(model, mesh, Overlap.comet(chunks=2, groups=2))
    ignored = set(expert_parameters(model))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    model.to_empty(device="cpu")
    model.init_weights(3)
    eager = build_model(FSDP_SPEC, seed=3)
    for key, value in model.state_dict().items():
        assert torch.equal(value.full_tensor(), eager.state_dict()[key]), key
    ids = torch.randint(0, 37, (4, 8), generator=torch.Generator().manual_seed(0))
    model(ids[2 * rank : 2 * rank + 2]).square().mean().backward()
    (sum(eager(ids[2 * r : 2 * r + 2]).square().mean() for r in range(2)) / 2).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ref_norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), 1.0)
    torch.testing.assert_close(norm.full_tensor(), ref_norm)
    for optimizer in (
        torch.optim.SGD(model.parameters(), 0.1),
        torch.optim.SGD(eager.parameters(), 0.1),
    ):
        optimizer.step()
    params = dict(eager.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.full_tensor(), params[name], msg=name)


def test_expert_parallel_composes_with_fsdp2():
    """Experts sharded by EP over the same 2 ranks FSDP2 shards the dense part over: meta
    init, gradients, gradient clipping and an optimizer step all match one process."""
    run_ranks(_fsdp_worker)
