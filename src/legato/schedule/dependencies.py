"""The dependency rules of the MEPipe note, shared by builders, validator and simulator.

For a unit (micro-batch mb, slice j, virtual stage vs), with k slices, along the stages
of mb's route (all S virtual stages; one model copy under DualPipe's placement):

* F(mb,j,vs) needs F(mb,j,vs-1) (its input, unless vs is the route's first stage) and F(mb,j-1,vs) (the K/V prefix of the
  earlier slices);
* B(mb,j,vs) needs B(mb,j,vs+1) (its output gradient), F(mb,j,vs) (its activations) and
  B(mb,j+1,vs): slices go backward in reverse order, because each slice's attention
  backward produces dK/dV for the whole prefix, which earlier slices add to their own;
* W(mb,j,vs,g) needs B(mb,j,vs); a fused BW follows the B rules.

Edges between stages on different ranks become a SEND on the producer's rank and a
RECV on the consumer's rank (``with_communication``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from legato.schedule.ir import Action, Schedule


def backward_kind(s: Schedule) -> str:
    """The action that carries the input gradient: ``BW`` when fused, else ``B``."""
    return "BW" if s.fused else "B"


def producers(a: Action, s: Schedule) -> tuple[Action, ...]:
    """Compute actions whose results compute action ``a`` needs."""
    mb, vs, j = a.microbatch, a.stage, a.seq_slice
    route = s.route(mb)
    if a.kind == "F":
        out = [Action("F", mb, vs - 1, j)] if vs > route.start else []
        if j > 0:
            out.append(Action("F", mb, vs, j - 1))
        return tuple(out)
    if a.kind == "W":
        return (Action("B", mb, vs, j),)
    bk = backward_kind(s)
    out = [Action(bk, mb, vs + 1, j)] if vs < route.stop - 1 else []
    out.append(Action("F", mb, vs, j))
    if j < s.slices - 1:
        out.append(Action(bk, mb, vs, j + 1))
    return tuple(out)


def consumers(a: Action, s: Schedule) -> tuple[Action, ...]:
    """Compute actions that need the result of compute action ``a`` (inverse of producers)."""
    mb, vs, j = a.microbatch, a.stage, a.seq_slice
    bk, route = backward_kind(s), s.route(mb)
    if a.kind == "F":
        out = [Action("F", mb, vs + 1, j)] if vs < route.stop - 1 else []
        if j < s.slices - 1:
            out.append(Action("F", mb, vs, j + 1))
        out.append(Action(bk, mb, vs, j))
        return tuple(out)
    if a.kind == "W":
        return ()
    out = [Action(bk, mb, vs - 1, j)] if vs > route.start else []
    if j > 0:
        out.append(Action(bk, mb, vs, j - 1))
    if a.kind == "B":
        out.extend(Action("W", mb, vs, j, g) for g in range(s.w_subtasks))
    return tuple(out)


def unit_actions(s: Schedule, mb: int, vs: int, j: int) -> tuple[Action, ...]:
    """The compute actions of one unit: F then BW, or F, B and its W subtasks."""
    if s.fused:
        return (Action("F", mb, vs, j), Action("BW", mb, vs, j))
    ws = tuple(Action("W", mb, vs, j, g) for g in range(s.w_subtasks))
    return (Action("F", mb, vs, j), Action("B", mb, vs, j), *ws)


def compute_actions(s: Schedule) -> Iterator[Action]:
    """Every compute action the schedule must run exactly once."""
    for mb in range(s.microbatches):
        for vs in s.route(mb):
            for j in range(s.slices):
                yield from unit_actions(s, mb, vs, j)


def message_of(producer: Action, consumer: Action, s: Schedule) -> tuple[Action, Action] | None:
    """(send, recv) carrying ``producer``'s result to ``consumer`` when they sit on
    different ranks and the edge crosses stages; ``None`` for a local edge."""
    rank = s.placement.rank
    if producer.stage == consumer.stage or rank(producer.stage) == rank(consumer.stage):
        return None
    mb, j = producer.microbatch, producer.seq_slice
    if producer.kind == "F":
        return Action("SEND_F", mb, producer.stage, j), Action("RECV_F", mb, consumer.stage, j)
    return Action("SEND_B", mb, producer.stage, j), Action("RECV_B", mb, consumer.stage, j)


def matching(comm: Action) -> Action:
    """The other end of a transfer: SEND_F@s <-> RECV_F@s+1, SEND_B@s <-> RECV_B@s-1."""
    mb, vs, j = comm.microbatch, comm.stage, comm.seq_slice
    return {
        "SEND_F": lambda: Action("RECV_F", mb, vs + 1, j),
        "RECV_F": lambda: Action("SEND_F", mb, vs - 1, j),
        "SEND_B": lambda: Action("RECV_B", mb, vs - 1, j),
        "RECV_B": lambda: Action("SEND_B", mb, vs + 1, j),
    }[comm.kind]()


def attached_compute(comm: Action, s: Schedule) -> Action:
    """The compute action on the same rank that a send follows or a receive precedes."""
    kind = "F" if comm.kind.endswith("_F") else backward_kind(s)
    return Action(kind, comm.microbatch, comm.stage, comm.seq_slice)


def with_communication(
    s: Schedule, compute: Sequence[Sequence[Action]]
) -> tuple[tuple[Action, ...], ...]:
    """Insert each receive right before its consumer and each send right after its producer."""
    ranks = []
    for actions in compute:
        out: list[Action] = []
        for a in actions:
            for p in producers(a, s):
                msg = message_of(p, a, s)
                if msg:
                    out.append(msg[1])
            out.append(a)
            for c in consumers(a, s):
                msg = message_of(a, c, s)
                if msg:
                    out.append(msg[0])
        ranks.append(tuple(out))
    return tuple(ranks)
