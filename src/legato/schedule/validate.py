"""Check a schedule against the dependency rules before anyone runs it.

``validate`` returns every problem it finds, one line each: indices out of range,
actions on the wrong rank, compute units missing or repeated, sends without their
receive (or the reverse), an action placed before something it needs on its own rank
(e.g. slice backwards in forward order), and finally, when the lists are otherwise
sound, a deadlock found by executing them (each blocked rank's next action and what it
waits for). ``check`` raises the first problem as a ``ScheduleError``.
"""

from __future__ import annotations

from collections import Counter

from legato.schedule.costs import CostModel
from legato.schedule.dependencies import (
    attached_compute,
    compute_actions,
    message_of,
    producers,
)
from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Schedule
from legato.schedule.simulate import execute


def _range_problems(s: Schedule) -> list[str]:
    problems = []
    if len(s.ranks) != s.stages:
        problems.append(f"schedule has {len(s.ranks)} rank lists for {s.stages} stages")
    limits = (
        ("microbatch", "microbatches", s.microbatches),
        ("stage", "virtual stages", s.num_stages),
        ("seq_slice", "slices", s.slices),
        ("subtask", "w_subtasks", s.w_subtasks),
    )
    for d, actions in enumerate(s.ranks):
        for a in actions:
            bad = [f"{field} {getattr(a, field)} >= {name} {n}" for field, name, n in limits
                   if getattr(a, field) >= n]  # fmt: skip
            if bad:
                problems.append(f"rank {d}: {a} is out of range ({', '.join(bad)})")
            elif s.placement.rank(a.stage) != d:
                problems.append(f"rank {d}: {a} belongs to rank {s.placement.rank(a.stage)}")
    return problems


def _unit_problems(s: Schedule) -> list[str]:
    counts = Counter(a for actions in s.ranks for a in actions)
    expected = set(compute_actions(s))
    problems = [f"{a} is missing" for a in compute_actions(s) if a not in counts]
    for a, n in counts.items():
        if a.is_compute and a not in expected:
            problems.append(f"{a} does not belong to a {s.backward}-backward schedule")
        elif n > 1:
            problems.append(f"{a} appears {n} times")
    return problems


def _message_problems(s: Schedule) -> list[str]:
    present = {a for actions in s.ranks for a in actions if not a.is_compute}
    pairs = {
        msg for c in compute_actions(s) for p in producers(c, s) if (msg := message_of(p, c, s))
    }
    rank = s.placement.rank
    problems = []
    for send, recv in sorted(pairs, key=str):
        where = f"{send} on rank {rank(send.stage)}", f"{recv} on rank {rank(recv.stage)}"
        if send not in present and recv not in present:
            problems.append(f"neither {where[0]} nor {where[1]} is there")
        elif recv not in present:
            problems.append(f"{where[0]} has no matching {where[1]}")
        elif send not in present:
            problems.append(f"{where[1]} has no matching {where[0]}")
    needed = {a for pair in pairs for a in pair}
    problems += [
        f"{a} is not a needed cross-rank transfer" for a in sorted(present - needed, key=str)
    ]
    return problems


def _order_problems(s: Schedule) -> list[str]:
    problems = []
    for d, actions in enumerate(s.ranks):
        pos = {a: i for i, a in enumerate(actions)}
        for i, a in enumerate(actions):
            if a.kind.startswith("SEND"):
                needs = [attached_compute(a, s)]
            elif a.kind.startswith("RECV"):
                after = attached_compute(a, s)
                if after in pos and pos[after] < i:
                    problems.append(f"rank {d}: {a} comes after {after}, which needs it")
                continue
            else:
                needs = [(message_of(p, a, s) or (None, p))[1] for p in producers(a, s)]
            for need in needs:
                if need in pos and pos[need] > i:
                    hint = ""
                    if need.kind == a.kind and need.seq_slice == a.seq_slice + 1:
                        hint = " (slices go backward in reverse order)"
                    problems.append(f"rank {d}: {a} comes before {need}, which it needs{hint}")
    return problems


def validate(s: Schedule) -> list[str]:
    """Every problem of ``s``, one line each; empty when it is valid and deadlock-free."""
    problems = _range_problems(s)
    if problems:
        return problems
    problems = _unit_problems(s) + _message_problems(s) + _order_problems(s)
    if problems:
        return problems
    _, deadlock = execute(s, CostModel())
    return [deadlock] if deadlock else []


def check(s: Schedule) -> None:
    """Raise ``ScheduleError`` with the first problem of ``s`` (and how many more)."""
    problems = validate(s)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ScheduleError(f"schedule {s.name}: {problems[0]}{more}")
