"""Execute the planner's tensor-parallel layouts with DTensor, and measure their collectives.

The planner (``legato.plan``) writes every op of a block with SBP placements per mesh
axis; this module applies them to the reference block of ``legato.models`` (HF names
``self_attn.q_proj``, ``mlp.down_proj``, ...), so what the planner counts can be checked
against what torch actually sends:

* :func:`apply_tensor_parallel`: 1-D TP (optionally with sequence parallelism) through
  torch's ``parallelize_module``; the ColwiseParallel / RowwiseParallel /
  SequenceParallel / PrepareModuleInput plan is *derived* from the planner's placements
  (a weight split on dim 0 is column-parallel, on dim 1 row-parallel, a norm on a
  sequence-split input is sequence-parallel).
* :func:`run_dense_layout`: any dense layout, 2-D TP included, op by op on DTensors with
  the weights of a reference block (:func:`place_weights`): before each op its inputs
  are redistributed to the
  placements the planner wrote, and the op's outputs must come out with the placements
  the planner declared (else ``LayoutMismatch``). The attention core runs on the local
  shards (as a fused kernel would): sequence-split queries see their causal rows of a
  mask split the same way.
* :class:`CollectiveRecorder`: ``CommDebugMode`` that also records each collective's kind,
  mesh axis and bytes per device, in the planner's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Partial as TorchPartial
from torch.distributed.tensor import Replicate as TorchReplicate
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from legato.layout.placements import Collective, Partial, Placement, Shard, collective_bytes
from legato.layout.sbp_layout import PartLayout, PlacedOp, read_gradients
from legato.models.rope import apply_rope
from legato.parallel.tensor_families import finish_block
from legato.specs.model import ModelSpec


class LayoutMismatch(RuntimeError):
    """DTensor produced other placements than the planner's layout declares."""


def to_torch(p: Placement):
    """The DTensor placement of a planner placement (the same names)."""
    if isinstance(p, Shard):
        return TorchShard(p.dim)
    return TorchPartial() if isinstance(p, Partial) else TorchReplicate()


def dtensor_placements(layout: Mapping[str, Placement], mesh: DeviceMesh) -> list:
    """A planner layout (axis name -> placement) in ``mesh``'s dimension order."""
    names = mesh.mesh_dim_names or ()
    unknown = set(layout) - set(names)
    if unknown:
        raise ValueError(f"layout axes {sorted(unknown)} are not dimensions of mesh {names}")
    return [to_torch(layout[n]) if n in layout else TorchReplicate() for n in names]


def tensor_parallel_plan(layout: PartLayout, axis: str = "tp") -> dict[str, Any]:
    """``parallelize_module`` plan of a reference block, derived from a 1-D dense layout:
    a weight split on dim 0 is ColwiseParallel, on dim 1 RowwiseParallel (its output goes
    to the placement the next reader wants), a norm on a split input SequenceParallel,
    and the attention / MLP modules gather a sequence-split input (PrepareModuleInput)."""
    if layout.part != "dense" or [a.name for a in layout.segments[0].axes] != [axis]:
        raise ValueError(
            f"a parallelize_module plan needs a dense layout on the {axis!r} axis only"
        )
    ops = layout.segments[0].ops
    wanted: dict[str, Placement] = {}  # tensor -> placement its first reader wants
    written: dict[str, Placement] = {}  # tensor -> placement its producer writes
    for placed in ops:
        for name, where in placed.inputs:
            wanted.setdefault(name, where[axis])
        written.update((name, where[axis]) for name, where in placed.outputs)
    plan: dict[str, Any] = {}
    for placed in ops:
        source = placed.inputs[0][1][axis]
        for weight, where in placed.weights:
            split, module = where[axis], weight.removesuffix(".weight")
            if isinstance(split, Shard) and split.dim == 0:
                plan[module] = ColwiseParallel(input_layouts=to_torch(source))
            elif isinstance(split, Shard):
                out = to_torch(wanted[placed.outputs[0][0]])
                local = not isinstance(out, TorchShard)  # a split output feeds a DTensor add
                plan[module] = RowwiseParallel(output_layouts=out, use_local_output=local)
            elif placed.op.kind == "norm" and isinstance(source, Shard):
                plan[module] = SequenceParallel()
        arriving = written.get(placed.inputs[0][0])
        if placed.op.kind in ("qkv", "mlp_up") and isinstance(arriving, Shard):
            parent = placed.weights[0][0].split(".")[0]  # self_attn / mlp
            plan[parent] = PrepareModuleInput(  # (x, the forward context)
                input_layouts=(to_torch(arriving), None),
                desired_input_layouts=(to_torch(source), None),
            )
    return plan


def apply_tensor_parallel(block: nn.Module, mesh: DeviceMesh, layout: PartLayout) -> nn.Module:
    """Shard a reference :class:`~legato.models.Block` in place by a 1-D dense layout on
    ``mesh`` (one dimension, named ``tp``). With sequence parallelism the block takes and
    returns sequence-split DTensors; without, plain replicated tensors."""
    parallelize_module(block, mesh, tensor_parallel_plan(layout))
    finish_block(block, mesh)  # each rank's projections hold its share of the heads
    return block


# --- op-by-op execution of a dense layout ---------------------------------------------


def _attention_core(q: DTensor, k: DTensor, v: DTensor, ctx: dict) -> DTensor:
    """RoPE and causal GQA attention on each rank's shards of q, k, v [b, s, heads*d], as
    a fused kernel would run. cos/sin and the causal mask are sliced like the queries
    (batch and sequence), so a sequence-split query sees its own rows; keys and values
    replicated where the queries are split get partial gradients."""
    mesh, d = q.device_mesh, ctx["head_dim"]
    cos, sin = ctx["rope"]

    def sliced_like(full: Tensor, ref: DTensor, dims: dict[int, int]) -> Tensor:
        places = [
            TorchShard(dims[p.dim]) if isinstance(p, TorchShard) and p.dim in dims
            else TorchReplicate()
            for p in ref.placements
        ]  # fmt: skip
        return distribute_tensor(full, mesh, places, src_data_rank=None).to_local()

    def heads(t: DTensor) -> Tensor:  # local [b, s, h*d] -> [b, h, s, d]
        grads = [
            TorchPartial() if isinstance(p, TorchReplicate) and isinstance(pq, TorchShard) else p
            for p, pq in zip(t.placements, q.placements, strict=True)
        ]
        local = t.to_local(grad_placements=grads)
        return local.view(local.shape[0], local.shape[1], -1, d).transpose(1, 2)

    rope = {0: 0, 1: 1}  # batch and sequence dims of cos/sin [b, s, d]
    q4 = apply_rope(heads(q), sliced_like(cos, q, rope), sliced_like(sin, q, rope))
    k4 = apply_rope(heads(k), sliced_like(cos, k, rope), sliced_like(sin, k, rope))
    mask = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool, device=cos.device).tril()
    out = F.scaled_dot_product_attention(
        q4,
        k4,
        heads(v),
        attn_mask=sliced_like(mask, q, {1: 0}),
        enable_gqa=k4.shape[1] != q4.shape[1],
    )
    out = out.transpose(1, 2).reshape(q4.shape[0], q4.shape[2], -1)
    return DTensor.from_local(out, mesh, q.placements, shape=q.shape, stride=q.stride())


def _ops(ctx: dict) -> dict[str, Callable[..., tuple]]:
    """Op kind -> function of (inputs..., weights) returning the outputs, in the math of
    the reference block (RMSNorm, RoPE + GQA attention, SwiGLU or GeLU)."""

    def norm_stats(x, w):  # a sum, so that a hidden-split x gives a partial sum
        return (x.pow(2).sum(-1, keepdim=True),)

    def norm(x, ss, w):
        return (x * torch.rsqrt(ss / ctx["hidden"] + ctx["eps"]) * w[0],)

    def linear(x, w):
        return tuple(F.linear(x, wi) for wi in w)

    def act(*inputs_and_weights):
        if len(inputs_and_weights) == 3:  # gate, up
            return (F.silu(inputs_and_weights[0]) * inputs_and_weights[1],)
        return (F.gelu(inputs_and_weights[0], approximate="tanh"),)

    def residual(*inputs_and_weights):
        total = inputs_and_weights[0]
        for t in inputs_and_weights[1:-1]:
            total = total + t
        return (total,)

    return {
        "norm.stats": norm_stats,
        "norm": norm,
        "qkv": linear,
        "attn_core": lambda q, k, v, w: (_attention_core(q, k, v, ctx),),
        "o_proj": linear,
        "residual": residual,
        "mlp_up": linear,
        "mlp_act": act,
        "mlp_down": linear,
    }


def place_weights(block: nn.Module, mesh: DeviceMesh, layout: PartLayout) -> dict[str, DTensor]:
    """The block's weights as leaf DTensors with the layout's placements (by HF name)."""
    params = dict(block.named_parameters())
    placed = {}
    for op in layout.segments[0].ops:
        for name, where in op.weights:
            placed[name] = _place(params[name].detach(), where, mesh).requires_grad_()
    return placed


def place_input(x: Tensor, mesh: DeviceMesh, layout: PartLayout) -> DTensor:
    """The block input ``x`` [b, s, h] as a leaf DTensor, placed as its first reader wants."""
    first = next(where for op in layout.segments[0].ops for name, where in op.inputs if name == "x")
    return _place(x.detach(), first, mesh).requires_grad_()


def run_dense_layout(
    weights: Mapping[str, DTensor],
    x: DTensor,
    rope: tuple[Tensor, Tensor],
    layout: PartLayout,
    model: ModelSpec,
    eps: float,
) -> DTensor:
    """Run a dense block as the planner's ``layout`` says, op by op: inputs redistributed
    to the placements each op wants, outputs checked against the placements it declares.
    ``weights`` and ``x`` come from :func:`place_weights` / :func:`place_input` on a mesh
    whose dimension names are the layout's axes; ``rope`` (cos, sin [b, s, head_dim]) is
    the same full tensor on every rank. Returns the block output."""
    if layout.part != "dense":
        raise ValueError(f"run_dense_layout runs dense layers, got a {layout.part} layout")
    mesh = x.device_mesh
    ctx = {"rope": rope, "head_dim": model.head_dim, "hidden": model.hidden_size, "eps": eps}
    ops = _ops(ctx)
    values: dict[str, DTensor] = {"x": x}
    grads = {(g.op, g.tensor): g for g in read_gradients(layout)}
    for placed in layout.segments[0].ops:
        args = []
        for name, where in placed.inputs:
            g = grads[(placed.op.name, name)]
            args.append(
                _Redistribute.apply(
                    values[name],
                    dtensor_placements(where, mesh),
                    dtensor_placements(g.arrives, mesh),
                    dtensor_placements(g.leaves, mesh),
                )
            )
        outputs = ops[placed.op.kind](*args, [weights[name] for name, _ in placed.weights])
        for (name, where), value in zip(placed.outputs, outputs, strict=True):
            _check(placed, name, value, dtensor_placements(where, mesh))
            values[name] = value
    return values["y"]


def _place(full: Tensor, where: Mapping, mesh: DeviceMesh) -> DTensor:
    """Every rank holds the same full tensor (same seed), so placing it is a local slice:
    no communication, so a recorder sees only what the layout itself sends."""
    return distribute_tensor(full, mesh, dtensor_placements(where, mesh), src_data_rank=None)


class _Redistribute(torch.autograd.Function):
    """Redistribute with the backward the planner prescribes: the incoming gradient is
    brought to the placements the planner says it arrives with (a no-op when DTensor's
    op backward produced them), then to the placements it leaves with."""

    @staticmethod
    def forward(ctx, x: DTensor, wanted: list, arrives: list, leaves: list) -> DTensor:
        ctx.places = (arrives, leaves)
        return x.redistribute(x.device_mesh, wanted)

    @staticmethod
    def backward(ctx, grad: DTensor):
        arrives, leaves = ctx.places
        grad = grad.redistribute(grad.device_mesh, arrives)
        return grad.redistribute(grad.device_mesh, leaves), None, None, None


def _check(placed: PlacedOp, name: str, value: DTensor, wanted: list) -> None:
    got = list(value.placements)
    if any(type(g) is not type(w) or g != w for g, w in zip(got, wanted, strict=True)):
        raise LayoutMismatch(
            f"op {placed.op.name}: {name} came out {got}, the layout declares {wanted}"
        )


# --- measuring collectives --------------------------------------------------------------

_KINDS = {
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "all_reduce": "all-reduce",
    "all_to_all_single": "all-to-all",
}


class CollectiveRecorder(CommDebugMode):
    """CommDebugMode that also keeps, per collective, the planner's (kind, mesh axis,
    bytes per device), the bytes computed from the local input by the same formulas the
    planner uses. ``forward`` and ``backward`` split them by pass."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.axis_of = {mesh.get_group(name).group_name: name for name in mesh.mesh_dim_names or ()}
        self.sizes = {name: mesh.size(i) for i, name in enumerate(mesh.mesh_dim_names or ())}
        self.forward: list[Collective] = []
        self.backward: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
        if name in _KINDS and not any(t is DTensor for t in types):
            group = next(a for a in (*args, *(kwargs or {}).values()) if isinstance(a, str)
                         and a in self.axis_of)  # fmt: skip
            self._record(_KINDS[name], self.axis_of[group], args[0])
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _record(self, kind: str, axis: str, local: Tensor) -> None:
        p = self.sizes[axis]
        local_bytes = local.numel() * local.element_size()
        group_bytes = local_bytes * p if kind in ("all-gather", "all-to-all") else local_bytes
        entry = Collective(kind, axis, collective_bytes(kind, group_bytes, p))
        (self.backward if self.advanced_module_tracker.is_bw else self.forward).append(entry)
