"""Execute any schedule of ``legato.schedule``'s IR on real stages with torch.distributed.

Why our own executor and not ``torch.distributed.pipelining``'s
``_PipelineScheduleRuntime``: that runtime executes per-rank action lists too, but its
units are whole micro-batches. A slice-level schedule needs per-slice K/V state carried
between units and its gradient added back, and combined with the runtime's I/W split
(which re-walks a retained graph from captured intermediate gradients) that trick gave
silently wrong gradients (docs/pipeline_schedules.md). Here each (micro-batch, slice, stage) unit
owns an independent autograd graph (``legato.models.slice_attention``), B is one
``torch.autograd.grad`` w.r.t. the stage input, the K/V prefix leaves and the non-linear
parameters, and W runs the deferred dW = dY^T X GEMMs (``weight_grad``). Every schedule
is checked against the unpipelined model in ``tests/distributed``. The baselines in
``benchmarks/pipeline_schedules.py`` still run torch's own schedules side by side.

Loss convention (as the trainer's): the last stage computes ``loss_fn(logits, labels)``
as a *sum* over the slice's tokens, times ``loss_scale`` (default 1 / number of label
tokens that are not ``IGNORE_INDEX`` in the whole batch), so the summed units are the
batch's mean loss and the gradients those of that mean. Gradients are *added* to
``param.grad``; zero them between steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.tensor import DTensor

from legato.errors import ConfigError
from legato.memory import chunked_cross_entropy
from legato.models.attention import attention_override
from legato.models.slice_attention import ContextAttention, PrefixKVCache
from legato.moe.layer import moe_aux_loss
from legato.parallel.pipeline.meter import ActivationMeter
from legato.parallel.pipeline.p2p import P2P
from legato.parallel.pipeline.stages import StageModule
from legato.parallel.pipeline.weight_grad import (
    DeferLinearWeightGrads,
    LinearGrad,
    apply_weight_grads,
    deferred_params,
    weight_grad_groups,
)
from legato.schedule import Action, Schedule, token_bounds

IGNORE_INDEX = -100
LossFn = Callable[[Tensor, Tensor], Tensor]


def token_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Summed cross-entropy over the tokens (``IGNORE_INDEX`` labels carry no loss).
    Vocabulary-parallel logits (under ``loss_parallel``) give a replicated DTensor: the
    same sum on every tensor-parallel rank, returned as a plain tensor."""
    loss = F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def stage_loss_sum(
    stage: StageModule,
    inp: Tensor,
    positions: Tensor,
    labels: Tensor,
    loss_fn: LossFn = token_cross_entropy,
    loss_chunk: int = 0,
) -> Tensor:
    """The last stage's summed token loss: from its logits, or with ``loss_chunk`` from
    its hidden states, the LM head applied a chunk of tokens at a time."""
    if not loss_chunk:
        return loss_fn(stage(inp, positions), labels)
    hidden = stage.hidden_states(inp, positions)
    return chunked_cross_entropy(
        hidden, stage.output_weight(), labels, chunk_size=loss_chunk,
        ignore_index=IGNORE_INDEX, reduction="sum",
    )  # fmt: skip


@dataclass
class StepStats:
    """What the last ``step`` measured on this rank."""

    step_seconds: float = 0.0
    peak_activation_bytes: int = 0
    action_seconds: dict[Action, float] = field(default_factory=dict)


@dataclass
class _Unit:
    """A (micro-batch, slice, stage) between its F and its last W."""

    x: Tensor | None  # stage input (a leaf), None on the first stage
    out: Tensor | None  # hidden states, or the scaled loss on the last stage
    held: list[Any]  # meter handles of what the unit keeps until its backward
    records: list[LinearGrad]
    aux: Tensor | None = None  # the scaled MoE load-balance loss of the unit's forward
    groups: list[list[LinearGrad]] = field(default_factory=list)
    w_left: int = 0


class PipelineRunner:
    """Runs ``schedule``'s action list of pipeline rank ``rank`` on ``stages``.

    ``stages`` maps each virtual stage this rank holds to its module
    (``build_stages``); ``group`` is the pipeline process group (``None``: the default
    group, or no group at all for a single-rank schedule). ``message_dtype`` is the dtype
    of activations and gradients on the wire (default: the parameters');
    ``sequence_shards`` the ranks a message's tokens are split over (tp under sequence
    parallelism: each sends its own share). ``loss_chunk`` > 0: the last stage's loss
    through the chunked LM head (``legato.memory``; ``loss_fn`` is then not used).
    ``gathered(stage)``: entered around each B, so that the stage holds the parameters its
    forward used (FSDP2 resharded after forward gathers them again; ZeRO-3).
    ``aux_loss_scale`` > 0: each unit's backward also carries the MoE load-balance loss
    of its stage's layers (``legato.moe``) times this factor (not added to the loss).
    ``context``: the context-parallel attention each slice's K/V cache runs under (cp
    with ``slices > 1``; the batch is then each rank's share of every slice).
    ``measure`` also times every compute action (``stats.action_seconds``).
    """

    def __init__(
        self,
        stages: Mapping[int, StageModule],
        schedule: Schedule,
        *,
        rank: int,
        group: dist.ProcessGroup | None = None,
        loss_fn: LossFn = token_cross_entropy,
        message_dtype: torch.dtype | None = None,
        sequence_shards: int = 1,
        loss_chunk: int = 0,
        gathered: Callable[[StageModule], contextlib.AbstractContextManager] | None = None,
        aux_loss_scale: float = 0.0,
        context: ContextAttention | None = None,
        measure: bool = False,
    ) -> None:
        placement = schedule.placement
        want = {placement.stage(rank, c) for c in range(placement.chunks)}
        if set(stages) != want:
            raise ConfigError(
                f"stages: pipeline rank {rank} of schedule {schedule.name!r} holds virtual "
                f"stages {sorted(want)}, got {sorted(stages)}"
            )
        if any(s.num_stages != schedule.num_stages for s in stages.values()):
            raise ConfigError(
                f"stages: built for another pipeline; schedule has {schedule.num_stages} stages"
            )
        if schedule.stages > 1:
            size = dist.get_world_size(group) if dist.is_initialized() else 1
            if size != schedule.stages:
                raise ConfigError(
                    f"group: schedule {schedule.name!r} has {schedule.stages} pipeline ranks, "
                    f"the process group {size}"
                )
        self.stages, self.schedule, self.rank, self.group = dict(stages), schedule, rank, group
        self.loss_fn, self.measure = loss_fn, measure
        self.actions = schedule.ranks[rank]
        first = next(iter(stages.values()))
        param = next(first.parameters())
        self.device, self.dtype = param.device, message_dtype or param.dtype
        self.hidden_size = first.hidden_size
        self.sequence_shards, self.loss_chunk = sequence_shards, loss_chunk
        self.gathered = gathered or (lambda _stage: contextlib.nullcontext())
        self.aux_loss_scale = aux_loss_scale
        self.context = context
        self.meter = ActivationMeter()
        self.stats = StepStats()
        self._p2p: P2P | None = None
        # per-step state: units between F and their last W, K/V caches per (mb, stage),
        # tensors handed to a local stage or received, input gradients waiting for SEND_B
        self._units: dict[tuple[int, int, int], _Unit] = {}
        self._caches: dict[tuple[int, int], PrefixKVCache] = {}
        self._inbox: dict[tuple[str, int, int, int], Tensor] = {}
        self._grad_out: dict[tuple[int, int, int], Tensor] = {}
        self._cuts: tuple[int, ...] = ()
        self._ids: tuple[Tensor, ...] = ()
        self._labels: tuple[Tensor, ...] = ()
        self._positions: tuple[Tensor, ...] = ()
        self._loss_scale = self._multiplier = 1.0
        self._loss = torch.zeros(())
        self._handlers = {
            "F": self._forward, "B": self._backward, "BW": self._backward, "W": self._weight,
            "SEND_F": self._send, "SEND_B": self._send,
            "RECV_F": self._recv, "RECV_B": self._recv,
        }  # fmt: skip

    def parameters(self) -> list[torch.nn.Parameter]:
        """This rank's parameters, each once (a tied embedding held by two local stages
        too): what its optimizer updates."""
        seen: dict[int, torch.nn.Parameter] = {}
        for stage in self.stages.values():
            for p in stage.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    @property
    def loss_rank(self) -> int:
        """The pipeline rank that holds the last stage and returns the loss."""
        return self.schedule.placement.rank(self.schedule.num_stages - 1)

    # ------------------------------------------------------------------ the step

    def step(
        self,
        input_ids: Tensor,
        labels: Tensor,
        *,
        loss_scale: float | None = None,
        loss_multiplier: float = 1.0,
        position_ids: Tensor | None = None,
        sync_tied: bool = True,
    ) -> Tensor | None:
        """Run one schedule over the batch ``input_ids``/``labels`` [B, S] (the same on every
        rank); B is cut into the schedule's micro-batches, S into its slices. Returns the
        loss (a detached scalar) on the rank holding the last stage, else ``None``.
        ``position_ids`` [B, S]: the tokens' true positions when they are not ``0..S-1``
        (a context-parallel shard). ``sync_tied=False`` leaves ``sync_tied_embeddings``
        to the caller (after it reduced the gradients over data parallelism).
        ``loss_multiplier``: the backward runs on the loss (and the balance loss) times it,
        so every gradient comes out times it (fp16 loss scaling); the returned loss is not
        multiplied."""
        s = self.schedule
        if input_ids.shape != labels.shape or input_ids.dim() != 2:
            raise ConfigError(
                f"input_ids/labels: need the same [batch, seq] shape, got "
                f"{tuple(input_ids.shape)} and {tuple(labels.shape)}"
            )
        batch, seq = input_ids.shape
        if batch % s.microbatches:
            raise ConfigError(
                f"batch: {batch} rows cannot be cut into {s.microbatches} equal micro-batches"
            )
        self._cuts = token_bounds(s.slice_bounds, seq)
        self._ids = input_ids.to(self.device).chunk(s.microbatches)
        self._labels = labels.to(self.device).chunk(s.microbatches)
        if position_ids is None:
            position_ids = torch.arange(seq, device=self.device).expand(batch, -1)
        self._positions = position_ids.to(self.device).chunk(s.microbatches)
        if loss_scale is None:
            loss_scale = 1.0 / max(int((labels != IGNORE_INDEX).sum()), 1)
        self._loss_scale, self._multiplier = loss_scale, loss_multiplier
        self._loss = torch.zeros((), device=self.device)
        for state in (self._units, self._caches, self._inbox, self._grad_out):
            state.clear()  # after a failed step
        if self._p2p is None and s.stages > 1:
            self._p2p = P2P(s, self.rank, self.group, self._message_shape, self.dtype, self.device)
        buffers = [b for stage in self.stages.values() for b in stage.buffers()]
        self.meter.exclude([*self.parameters(), *buffers])  # as they are now (gathered)
        self.meter.reset_peak()
        self.stats = StepStats()
        start = time.perf_counter()
        for action in self.actions:
            if self.measure and action.is_compute:
                began = self._now()
                self._handlers[action.kind](action)
                self.stats.action_seconds[action] = self._now() - began
            else:
                self._handlers[action.kind](action)
        if self._p2p is not None:
            self._p2p.finish()
        if sync_tied:
            self.sync_tied_embeddings()
        self.stats.step_seconds = time.perf_counter() - start
        self.stats.peak_activation_bytes = self.meter.peak
        if self._units or self._inbox or self._grad_out or self._caches:
            raise RuntimeError(f"schedule {s.name!r}: rank {self.rank} left units unfinished")
        last = s.num_stages - 1
        return self._loss if last in self.stages else None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _message_shape(self, action: Action) -> tuple[int, ...]:
        rows = self._ids[action.microbatch].shape[0]
        j = action.seq_slice
        tokens = (self._cuts[j + 1] - self._cuts[j]) // self.sequence_shards
        return (rows, tokens, self.hidden_size)

    def _local(self, stage: int) -> bool:
        return stage in self.stages

    # ------------------------------------------------------------------ compute

    def _forward(self, a: Action) -> None:
        stage, (mb, j, vs) = self.stages[a.stage], a.unit
        lo, hi = self._cuts[j], self._cuts[j + 1]
        if stage.is_first:
            x, inp = None, self._ids[mb][:, lo:hi]
        else:
            x = inp = self._inbox.pop(("F", mb, vs, j)).detach().requires_grad_()
        positions = self._positions[mb][:, lo:hi]
        cache = None
        if self.schedule.slices > 1:
            cache = self._caches.setdefault(
                (mb, vs), PrefixKVCache(self.schedule.slices, self.context)
            )
        defer = None if self.schedule.fused else DeferLinearWeightGrads(self.meter.hold)
        with contextlib.ExitStack() as ctx:
            ctx.enter_context(self.meter.saved_tensors())
            if cache is not None:
                ctx.enter_context(attention_override(cache.attend_fn(j)))
            if defer is not None:
                ctx.enter_context(defer)
            if stage.is_last:
                out = self._stage_loss(stage, inp, positions, self._labels[mb][:, lo:hi])
            else:
                out = stage(inp, positions)
        aux = moe_aux_loss(stage) if self.aux_loss_scale else None
        if aux is not None:  # read now: the layers keep only their last forward's
            aux = aux.float() * (self.aux_loss_scale * self._multiplier)
        if stage.is_last:
            self._loss += out.detach() / self._multiplier
        elif self._local(vs + 1):
            self._inbox[("F", mb, vs + 1, j)] = out.detach()
        kept = [t for t in (x, out) if t is not None]
        kept += cache.slice_tensors(j) if cache is not None else []
        held = [self.meter.hold(t) for t in kept]
        self._units[a.unit] = _Unit(x, out, held, defer.records if defer else [], aux)

    def _stage_loss(
        self, stage: StageModule, inp: Tensor, positions: Tensor, labels: Tensor
    ) -> Tensor:
        """The last stage's scaled summed loss."""
        loss = stage_loss_sum(stage, inp, positions, labels, self.loss_fn, self.loss_chunk)
        return loss * (self._loss_scale * self._multiplier)

    def _backward(self, a: Action) -> None:
        stage, (mb, j, vs) = self.stages[a.stage], a.unit
        unit = self._units[a.unit]
        outputs, grads = [unit.out], [self._output_grad(a, stage, unit.out)]
        if unit.aux is not None:
            outputs.append(unit.aux)
            grads.append(torch.ones_like(unit.aux))
        cache = self._caches.get((mb, vs))
        leaves: list[Tensor] = []
        if cache is not None:
            extra_out, extra_grad = cache.backward_terms(j)
            outputs += extra_out
            grads += extra_grad
            leaves = cache.prefix_leaves(j)
        skip = deferred_params(unit.records)
        with self.gathered(stage):
            params = [p for p in stage.parameters() if p.requires_grad and id(p) not in skip]
            inputs = ([unit.x] if unit.x is not None else []) + leaves + params
            result = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
        if unit.x is not None:
            dx = result[0]
            if dx is None:
                dx = torch.zeros_like(unit.x)
            if self._local(vs - 1):
                self._inbox[("B", mb, vs - 1, j)] = dx
            else:
                self._grad_out[a.unit] = dx
        offset = int(unit.x is not None)
        if cache is not None:
            cache.add_prefix_grads(j, list(result[offset : offset + len(leaves)]))
            cache.release(j)
            if cache.empty:
                del self._caches[(mb, vs)]
        for p, g in zip(params, result[offset + len(leaves) :], strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)
        unit.x = unit.out = unit.aux = None
        unit.held = []
        if a.kind == "BW":
            del self._units[a.unit]
        else:
            unit.groups = weight_grad_groups(unit.records, self.schedule.w_subtasks)
            unit.records = []
            unit.w_left = self.schedule.w_subtasks

    def _output_grad(self, a: Action, stage: StageModule, out: Tensor) -> Tensor:
        if stage.is_last:
            return torch.ones_like(out)
        return self._inbox.pop(("B", a.microbatch, a.stage, a.seq_slice)).to(out.dtype)

    def _weight(self, a: Action) -> None:
        unit = self._units[a.unit]
        apply_weight_grads(unit.groups[a.subtask])
        unit.groups[a.subtask] = []
        unit.w_left -= 1
        if unit.w_left == 0:
            del self._units[a.unit]

    # ------------------------------------------------------------------ transfers

    def _send(self, a: Action) -> None:
        assert self._p2p is not None
        forward = a.kind == "SEND_F"
        self._p2p.send(a, self._units[a.unit].out if forward else self._grad_out.pop(a.unit))

    def _recv(self, a: Action) -> None:
        assert self._p2p is not None
        kind = "F" if a.kind == "RECV_F" else "B"
        self._inbox[(kind, a.microbatch, a.stage, a.seq_slice)] = self._p2p.recv(a)

    def sync_tied_embeddings(self) -> None:
        """With tied embeddings on two ranks (first and last stage), each holds a copy of
        the matrix; both get the sum of the two gradients so their updates stay equal.
        A sharded gradient (FSDP2 in the stages) is summed shard by shard: both copies are
        sharded alike over their data-parallel groups."""
        placement, last = self.schedule.placement, self.schedule.num_stages - 1
        first_rank, last_rank = placement.rank(0), placement.rank(last)
        tied = next(iter(self.stages.values())).tied_embeddings
        if not tied or first_rank == last_rank or self.rank not in (first_rank, last_rank):
            return
        if self.rank == first_rank:
            weight, peer = self.stages[0].embed_tokens.weight, last_rank
        else:
            weight, peer = self.stages[last].output_embedding.weight, first_rank
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        grad = weight.grad
        if isinstance(grad, DTensor) and grad.placements != weight.placements:
            # tp: the head's gradient may come out of DTensor's matmul whole; both copies
            # must be sent as the same vocabulary shard
            grad = weight.grad = grad.redistribute(weight.device_mesh, weight.placements)
        mine = grad.to_local() if isinstance(grad, DTensor) else grad
        theirs = torch.empty_like(mine)
        peer = peer if self.group is None else dist.get_global_rank(self.group, peer)
        ops = [
            dist.P2POp(dist.isend, mine.contiguous(), peer, self.group),
            dist.P2POp(dist.irecv, theirs, peer, self.group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        mine.add_(theirs)
