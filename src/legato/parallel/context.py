"""Context parallelism (cp): attention over a sequence split across the ``cp`` ranks.

Layout (causal load balancing): each sequence of S tokens is cut into ``2 * cp`` chunks of
``c = S / (2 * cp)`` and cp rank r holds chunks r and ``2*cp - 1 - r`` (the zigzag), so
every rank has ``(2*cp + 1) * c**2`` (query, key) pairs of causal attention: the same
work, where a contiguous split would give the last rank ``2*cp - 1`` times the first's.
Everything outside attention is per token and runs unchanged on the local tokens; the
weights are replicated over cp, and their gradients are averaged over the ``dp x cp``
ranks (FSDP2 / DDP over ``mesh["dp_cp"]``) with the trainer's loss convention (summed
token loss times ``dp*cp`` over the label tokens of the global batch).

Attention (Llama 3's context parallelism): each rank all-gathers K and V over the cp group,
puts them back in sequence order, and its two query chunks attend causally to the keys up
to their own end (one SDPA call each, the causal mask aligned to the end). The backward
of the all-gather is a reduce-scatter of dK and dV. The collective is torch's own
``flex_cp_allgather`` (the custom op its context parallelism uses for FlexAttention, with
that autograd rule). Why not torch's ``context_parallel`` (ring attention): it reroutes
only the CUDA flash / efficient / cuDNN SDPA kernels; on CPU, SDPA runs
``aten._scaled_dot_product_flash_attention_for_cpu`` and the ring raises
``NotImplementedError: ... does not have a sharding strategy registered`` (torch 2.13,
gloo), so the same code could not run on gloo and NCCL. The all-gather form also keeps
GQA (``enable_gqa``) and MLA's different V head size as they are.

Cost, per attention layer and rank: the whole sequence's K and V
(``2 * B * S * num_kv_heads * head_dim`` elements) are held from the forward to the
backward, instead of ``1/cp`` of them; while being reordered there is a second copy,
freed at once. Communication: one all-gather of K and V forward, one reduce-scatter of
dK and dV backward, each ``(cp-1)/cp`` of that size (small beside the activations with
GQA; a ring would overlap it with compute, which this does not).

Usage (the trainer, per micro-batch, after counting the global batch's label tokens)::

    cp = apply_context_parallel(model, strategy, mesh)   # None when strategy.cp == 1
    inputs, labels, position_ids = cp.shard(inputs, labels)
    with cp.sharded():                                    # forward AND backward
        loss = token_loss_sum(model, inputs, labels, ...) * scale
        loss.backward()

``cp.sharded`` is a context factory of ``Parallelized.contexts``. Count the label tokens
before sharding (every cp rank holds the same full rows) or sum the count over dp x cp.
Within ``cp.sharded()`` a model without explicit ``position_ids`` gets the zigzag
positions (RoPE and learned positions see true positions); a caller that passes its own
(the pipeline runner) must pass ``position_ids`` from ``shard`` / ``position_ids``. The
context must also cover the backward where blocks are recomputed (their forward attends
again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from itertools import pairwise
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather
from torch.nn.attention.bias import causal_lower_right

from legato.errors import ConfigError
from legato.models.attention import attention_override, grouped_sdpa
from legato.models.transformer import Transformer
from legato.parallel.job import check_context_parallel
from legato.parallel.pipeline.stages import StageModule
from legato.specs.strategy import Strategy, StrategyError

SEQ_DIM = 2  # of q/k/v [B, H, S, D]

_ACTIVE: ContextVar[ContextParallel | None] = ContextVar("legato_context_parallel", default=None)


def zigzag_chunks(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two of the ``2 * cp`` sequence chunks cp rank ``cp_rank`` holds, in order."""
    return cp_rank, 2 * cp - 1 - cp_rank


def zigzag_positions(seq_len: int, cp_rank: int, cp: int, device: Any = None) -> Tensor:
    """The true positions [seq_len / cp] of cp rank ``cp_rank``'s tokens."""
    check_context_parallel(cp, seq_len, "the sequence length")
    c = seq_len // (2 * cp) if cp > 1 else seq_len
    chunks = zigzag_chunks(cp_rank, cp) if cp > 1 else (0,)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunks])


def shard_sequence(
    inputs: Tensor, labels: Tensor, cp_rank: int, cp: int, cuts: Sequence[int] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Rank ``cp_rank``'s zigzag share of ``inputs`` and ``labels`` [B, S] (already shifted:
    label t is the target of input t, so both take the same tokens) and their true
    ``position_ids`` [B, S / cp]. ``cuts``: a slice-level schedule's token cut points; each
    slice is then split as a sequence of its own, and this rank's share of slice j is the
    j-th of ``len(cuts) - 1`` equal parts of its local tokens (as the runner cuts them)."""
    cuts = cuts or (0, inputs.shape[1])
    positions = torch.cat([
        a + zigzag_positions(b - a, cp_rank, cp, inputs.device) for a, b in pairwise(cuts)
    ])  # fmt: skip
    batch = positions.expand(inputs.shape[0], -1)
    return inputs[:, positions], labels[:, positions], batch


class ContextParallel:
    """This rank's place in its cp group and the attention it runs there."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.size = mesh.size()
        self.rank = mesh.get_local_rank()
        self._group_name = mesh.get_group().group_name

    def shard(
        self, inputs: Tensor, labels: Tensor, cuts: Sequence[int] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """This rank's tokens of full sequences (or of each slice between ``cuts``):
        ``shard_sequence`` for this rank."""
        return shard_sequence(inputs, labels, self.rank, self.size, cuts)

    def position_ids(self, local_len: int, batch: int, device: Any = None) -> Tensor:
        """True positions [batch, local_len] of this rank's ``local_len`` tokens."""
        positions = zigzag_positions(local_len * self.size, self.rank, self.size, device)
        return positions.expand(batch, -1)

    @contextlib.contextmanager
    def sharded(self) -> Iterator[None]:
        """Within the block the model runs on this rank's zigzag shard: every ``attend``
        is :meth:`attend` and missing position ids are the shard's true positions."""
        token = _ACTIVE.set(self)
        try:
            with attention_override(self.attend):
                yield
        finally:
            _ACTIVE.reset(token)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
        """Causal attention of the local queries to the whole sequence's K/V."""
        if attn_mask is not None:
            raise ConfigError(
                "attn_mask: context parallelism (strategy.cp > 1) runs plain causal "
                "attention only; train packed-document masks with cp=1"
            )
        return self.attend_prefix(q, *self.gather_kv(k, v), ())

    def gather_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The local K/V all-gathered over cp, in sequence order (the backward
        reduce-scatters dK/dV): the keys of the whole sequence, or of the whole slice."""
        keys, values = flex_cp_allgather(k, v, SEQ_DIM, self._group_name)
        return _in_sequence_order(keys, self.size), _in_sequence_order(values, self.size)

    def attend_prefix(
        self, q: Tensor, keys: Tensor, values: Tensor, prefix: Sequence[Tensor]
    ) -> Tensor:
        """Causal attention of the local queries (this rank's two zigzag chunks of a
        sequence, or of one slice of it) to ``prefix`` (K0, V0, K1, V1, ... of the earlier
        slices, whole) and the gathered ``keys``/``values`` of their own span."""
        before = sum(t.shape[SEQ_DIM] for t in prefix[0::2])
        keys = torch.cat([*prefix[0::2], keys], dim=SEQ_DIM)
        values = torch.cat([*prefix[1::2], values], dim=SEQ_DIM)
        c = q.shape[SEQ_DIM] // 2
        outputs = []
        for half, chunk in enumerate(zigzag_chunks(self.rank, self.size)):
            visible = before + (chunk + 1) * c  # the prefix and chunks 0..chunk
            mask = causal_lower_right(c, visible)
            query = q[:, :, half * c : (half + 1) * c]
            outputs.append(
                grouped_sdpa(query, keys[:, :, :visible], values[:, :, :visible], mask, False)
            )
        return torch.cat(outputs, dim=SEQ_DIM)


def apply_context_parallel(
    model: nn.Module, strategy: Strategy, mesh: DeviceMesh
) -> ContextParallel | None:
    """Make ``model`` (a ``Transformer`` or a pipeline ``StageModule``) run on zigzag
    sequence shards over ``mesh["cp"]`` inside ``ContextParallel.sharded``; parameters are
    untouched. Returns None when ``strategy.cp == 1``."""
    if strategy.cp == 1:
        return None
    cp_mesh = mesh["cp"]
    if cp_mesh.size() != strategy.cp:
        raise StrategyError(
            f"strategy.cp: cp={strategy.cp} but the mesh's cp dimension has {cp_mesh.size()} ranks"
        )
    if isinstance(model, Transformer):
        target: nn.Module = model.model  # the Decoder computes the positions
    elif isinstance(model, StageModule):
        target = model
    else:
        raise TypeError(f"context parallelism lays out a Transformer or a StageModule, got {model}")
    target.register_forward_pre_hook(_shard_positions, with_kwargs=True)
    return ContextParallel(cp_mesh)


def _shard_positions(
    _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """Forward pre-hook: inside ``sharded()``, absent position ids are the shard's own."""
    active = _ACTIVE.get()
    given = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    if active is None or given is not None:
        return None
    x = args[0]
    positions = active.position_ids(x.shape[1], x.shape[0], x.device)
    if len(args) > 1:
        return (args[0], positions, *args[2:]), kwargs
    return args, {**kwargs, "position_ids": positions}


def _in_sequence_order(gathered: Tensor, cp: int) -> Tensor:
    """All-gathered [B, H, S, D] in rank order (r's chunks r, 2cp-1-r) -> sequence order."""
    b, h, s, d = gathered.shape
    by_rank = gathered.view(b, h, cp, 2, s // (2 * cp), d)
    # first halves are chunks 0..cp-1; second halves chunks 2cp-1..cp, reversed
    ordered = torch.cat([by_rank[:, :, :, 0], by_rank[:, :, :, 1].flip(2)], dim=2)
    return ordered.reshape(b, h, s, d)
