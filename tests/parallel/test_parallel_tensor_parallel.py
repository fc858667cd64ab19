"""The planner's tensor-parallel layouts, executed with DTensor: the collectives torch sends
(CommDebugMode) equal the planner's lists, kind, axis and bytes, forward and backward, and
the sharded block computes what the unsharded reference block computes.

1-D TP / TP+SP run torch's ``parallelize_module`` on real gloo processes (world size 2);
the 4-rank meshes (2-D TP, DP x TP, CP) run in one process under ``LocalTensorMode`` on
the fake process group, which keeps every rank's shard and runs collectives for real.
(Meshes that shard one tensor dim on two axes, e.g. CP x TP+SP, work too but DTensor's
sharding propagation takes ~10 s per block on them, so they are left to the planner's
hand-count tests.)
Tolerance: 1e-5 absolute on fp32 outputs and gradients.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from gloo_harness import run_ranks
from legato.layout import Shard, backward_collectives, forward_collectives, part_layout
from legato.models import build_model
from legato.models.attention import SdpaAttention
from legato.models.forward_context import ForwardContext
from legato.parallel import (
    CollectiveRecorder,
    LayoutMismatch,
    apply_tensor_parallel,
    place_input,
    place_weights,
    run_dense_layout,
    tensor_parallel_plan,
)
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy

SPEC = ModelSpec(name="tp-block", hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=48, vocab_size=64, seq_len=16)  # fmt: skip
B, S, TOL = 2, 16, 1e-5


def layout_of(text: str):
    dp = Strategy.parse(text).dp
    return part_layout(SPEC, Strategy.parse(f"{text},dtype=fp32,mbs={B // dp},gbs={B}"), "dense")


def reference():
    """The unsharded block, its input, RoPE tables, output and gradients (sum of outputs)."""
    model = build_model(SPEC, seed=0)
    block = model.model.layers[0]
    x = torch.randn(B, S, SPEC.hidden_size, generator=torch.Generator().manual_seed(1))
    x.requires_grad_()
    rope = model.model.rotary_emb(torch.arange(S).expand(B, S))
    out = block(x, ForwardContext(rope, SdpaAttention()))
    out.backward(torch.ones_like(out))
    grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad()
    return block, x.detach(), rope, out.detach(), x.grad, grads


def keys(collectives) -> list[tuple[str, str, float]]:
    return [c.key() for c in collectives]


def test_parallelize_plan_is_derived_from_the_placements():
    plan = tensor_parallel_plan(layout_of("tp=2,sp=1"))
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                 "mlp.up_proj"):  # fmt: skip
        assert isinstance(plan[name], ColwiseParallel)
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        assert isinstance(plan[name], RowwiseParallel)
        assert plan[name].output_layouts == (torch.distributed.tensor.Shard(1),)
    assert isinstance(plan["input_layernorm"], SequenceParallel)
    assert isinstance(plan["self_attn"], PrepareModuleInput)
    plain = tensor_parallel_plan(layout_of("tp=2"))
    assert not any(isinstance(s, (SequenceParallel, PrepareModuleInput)) for s in plain.values())
    assert plain["mlp.down_proj"].output_layouts == (torch.distributed.tensor.Replicate(),)


def _gloo_worker(rank: int) -> None:
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    ref_block, x, rope, ref_out, ref_gx, ref_grads = reference()
    for sp in (True, False):
        layout = layout_of(f"tp={world},sp={int(sp)}")
        block = apply_tensor_parallel(copy.deepcopy(ref_block), mesh, layout)
        inp = x.clone().requires_grad_()
        if sp:
            inp = distribute_tensor(x, mesh, [torch.distributed.tensor.Shard(1)],
                                    src_data_rank=None).requires_grad_()  # fmt: skip
        with CollectiveRecorder(mesh) as rec:
            out = block(inp, ForwardContext(rope, SdpaAttention()))
            ones = torch.ones(B, S, SPEC.hidden_size)
            grad = distribute_tensor(ones, mesh, out.placements, src_data_rank=None) if sp else ones
            out.backward(grad)
        assert keys(rec.forward) == keys(forward_collectives(layout)), (sp, rec.forward)
        # one nn.Linear per projection: the replicated input's gradient is reduced per weight
        assert keys(rec.backward) == keys(backward_collectives(layout, fused=False))
        counts = Counter(c.kind for c in rec.forward + rec.backward)
        torch_counts = {op.__name__: n for op, n in rec.get_comm_counts().items()}
        assert counts["all-gather"] == torch_counts.get("all_gather_into_tensor", 0)
        assert counts["reduce-scatter"] == torch_counts.get("reduce_scatter_tensor", 0)
        assert counts["all-reduce"] == torch_counts.get("all_reduce", 0)
        full = out.full_tensor() if isinstance(out, DTensor) else out
        torch.testing.assert_close(full.detach(), ref_out, atol=TOL, rtol=0)
        gx = inp.grad.full_tensor() if sp else inp.grad
        torch.testing.assert_close(gx, ref_gx, atol=TOL, rtol=0)
        for name, p in block.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            torch.testing.assert_close(g, ref_grads[name], atol=TOL, rtol=0, msg=name)


@pytest.mark.distributed
def test_1d_tp_and_sp_with_parallelize_module_on_gloo():
    run_ranks(_gloo_worker)


@pytest.fixture(scope="module")
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    yield 4
    dist.destroy_process_group()


def _local(t: torch.Tensor) -> torch.Tensor:
    """Rank 0's copy of a full tensor computed under LocalTensorMode (all ranks agree)."""
    return t._local_tensors[0] if hasattr(t, "_local_tensors") else t


@pytest.mark.parametrize(
    "text, axes",
    [("tp=2x2,sp=1", ("tp_x", "tp_y")), ("dp=2,tp=2", ("dp", "tp")), ("cp=4", ("cp",))],
)  # fmt: skip
def test_layouts_on_four_local_ranks(fake_world, text, axes):
    from torch.distributed._local_tensor import LocalTensorMode

    shape = (2, 2) if len(axes) == 2 else (4,)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=axes)
    block, x, rope, ref_out, ref_gx, ref_grads = reference()
    layout = layout_of(text)
    with LocalTensorMode(fake_world):
        weights, inp = place_weights(block, mesh, layout), place_input(x, mesh, layout)
        with CollectiveRecorder(mesh) as fwd:
            out = run_dense_layout(weights, inp, rope, layout, SPEC, block.input_layernorm.eps)
        ones = distribute_tensor(torch.ones_like(x), mesh, out.placements, src_data_rank=None)
        with CollectiveRecorder(mesh) as bwd:
            out.backward(ones)
        full, gx = out.full_tensor(), inp.grad.full_tensor()
        gw = {name: w.grad.full_tensor() for name, w in weights.items()}
    assert keys(fwd.forward + fwd.backward) == keys(forward_collectives(layout))
    assert keys(bwd.forward + bwd.backward) == keys(backward_collectives(layout))
    assert sum(fwd.get_comm_counts().values()) == len(forward_collectives(layout))
    torch.testing.assert_close(_local(full).detach(), ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(_local(gx), ref_gx, atol=TOL, rtol=0)
    for name, grad in gw.items():
        torch.testing.assert_close(_local(grad), ref_grads[name], atol=TOL, rtol=0, msg=name)


def test_a_wrong_layout_is_caught(fake_world):
    from torch.distributed._local_tensor import LocalTensorMode

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp_x", "tp_y"))
    block, x, rope, *_ = reference()
    layout = layout_of("tp=2x2,sp=1")
    ops = list(layout.segments[0].ops)
    i = next(i for i, op in enumerate(ops) if op.op.name == "qkv")
    ops[i] = replace(ops[i], outputs=tuple((n, {**w, "tp_x": Shard(2)}) for n, w in ops[i].outputs))
    bad = replace(layout, segments=(replace(layout.segments[0], ops=tuple(ops)),))
    with LocalTensorMode(fake_world), pytest.raises(LayoutMismatch, match="op qkv: q came out"):
        run_dense_layout(place_weights(block, mesh, bad), place_input(x, mesh, bad), rope, bad,
                         SPEC, 1e-5)  # fmt: skip
