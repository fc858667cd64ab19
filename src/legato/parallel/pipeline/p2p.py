"""Point-to-point transfers of a schedule: ``isend``/``irecv`` in an order both ends agree on.

NCCL matches sends and receives between two ranks by issue order, not by tag, and a
schedule's receives need not come in the order the peer sends (the V shape, slices and
deferred W reorder them). Each rank therefore knows, from the whole schedule, the order
in which every peer sends to it; when it needs message i from a peer it first posts the
receives for all earlier messages from that peer, in the sender's order, and then the
next one (a message of lookahead hides the receive latency). Gloo gets the same order
and a tag per message on top. Sends are asynchronous; their handles are
waited for at the end of the step (``finish``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from legato.schedule import Action, Schedule
from legato.schedule.dependencies import matching

ShapeOf = Callable[[Action], tuple[int, ...]]


class P2P:
    """The sends and receives of pipeline rank ``rank`` in ``schedule``.

    ``shape_of(action)`` gives the tensor shape a transfer carries; ``group`` maps pipeline
    ranks to global ranks (``None``: the default group, pipeline rank = global rank).
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        group: dist.ProcessGroup | None,
        shape_of: ShapeOf,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.rank, self.group = rank, group
        self.shape_of, self.dtype, self.device = shape_of, dtype, device
        placement = schedule.placement
        # per peer: the receives of this rank, in the order that peer sends them
        self._order: dict[int, list[Action]] = {}
        self._tag: dict[Action, int] = {}
        for src, actions in enumerate(schedule.ranks):
            sent_to: dict[int, int] = {}
            for a in actions:
                if not a.kind.startswith("SEND"):
                    continue
                recv = matching(a)
                dst = placement.rank(recv.stage)
                self._tag[a] = self._tag[recv] = sent_to.get(dst, 0)
                sent_to[dst] = self._tag[a] + 1
                if dst == rank:
                    self._order.setdefault(src, []).append(recv)
        self._peer = {recv: src for src, order in self._order.items() for recv in order}
        self._index = {recv: i for order in self._order.values() for i, recv in enumerate(order)}
        self._posted: dict[int, int] = dict.fromkeys(self._order, 0)
        self._pending: dict[Action, tuple[dist.Work, Tensor]] = {}
        self._sends: list[tuple[dist.Work, Tensor]] = []
        self._placement = placement

    def _global(self, pipeline_rank: int) -> int:
        if self.group is None:
            return pipeline_rank
        return dist.get_global_rank(self.group, pipeline_rank)

    def send(self, action: Action, tensor: Tensor) -> None:
        """Start sending ``tensor`` for the SEND action ``action``."""
        dst = self._placement.rank(matching(action).stage)
        tensor = tensor.detach().to(self.dtype).contiguous()
        work = dist.isend(tensor, self._global(dst), group=self.group, tag=self._tag[action])
        self._sends.append((work, tensor))

    def recv(self, action: Action) -> Tensor:
        """The tensor of the RECV action ``action``; blocks until it has arrived. The
        next receive from the same peer is posted right away (one message of lookahead)."""
        src = self._peer[action]
        index = self._index[action]
        self._post(src, index)
        work, buffer = self._pending.pop(action)
        work.wait()
        self._post(src, index + 1)
        return buffer

    def _post(self, src: int, index: int) -> None:
        """Post the receives from ``src`` up to number ``index`` in its send order."""
        order = self._order[src]
        while self._posted[src] <= min(index, len(order) - 1):
            recv = order[self._posted[src]]
            buffer = torch.empty(self.shape_of(recv), dtype=self.dtype, device=self.device)
            work = dist.irecv(buffer, self._global(src), group=self.group, tag=self._tag[recv])
            self._pending[recv] = (work, buffer)
            self._posted[src] += 1

    def finish(self) -> None:
        """Wait for every send of the step and check that nothing was left unreceived."""
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()
        if self._pending or any(self._posted[s] != len(o) for s, o in self._order.items()):
            raise RuntimeError(f"pipeline rank {self.rank}: receives left over at step end")
        self._posted = dict.fromkeys(self._order, 0)
