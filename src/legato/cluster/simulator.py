"""Event-driven simulation of a packing policy on a cluster, from arrivals to the last finish.

Time jumps from event to event: a job arrives, a job finishes, or the policy's round ends
(time-slicing and LAS policies re-decide every round). At each event the policy sees the
state (``ClusterView``) and returns the whole assignment; the simulator checks it, charges
``restart_s`` of lost time to every job that resumes or moves (a checkpoint restore — a
change of shares or local batches costs nothing, which is Gimbal's point) and runs every
placed job at the rate the shared speed model gives until the next event. Work is
conserved: a job finishes exactly when its completed steps reach its steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from legato.cluster.jobs import ClusterJob, ClusterShape, check_jobs
from legato.cluster.placement import Assignment, Placement, check_assignment
from legato.cluster.speed import job_rates
from legato.cluster.workloads import Workloads

RESTART_S = 30.0  # checkpoint save + restore of a preempted or moved job (Gavel/Tiresias' order)
MAX_EVENTS_PER_JOB = 20_000  # a bound on the loop: a policy that churns forever is a bug


@dataclass
class JobProgress:
    """One job's state as the policies see it."""

    job: ClusterJob
    done: float = 0.0  # steps completed
    attained_gpu_s: float = 0.0  # devices x seconds held (Tiresias' attained service)
    started_s: float | None = None
    finished_s: float | None = None
    placement: Placement | None = None
    last_run_s: float = -math.inf  # when it last held devices (time-slicing's order)
    since_s: float = 0.0  # when it got its current devices
    restarts: int = 0
    restart_left_s: float = 0.0

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def remaining(self) -> float:
        return max(self.job.steps - self.done, 0.0)


@dataclass
class ClusterView:
    """What a policy decides from: the time, the cluster, and the arrived, unfinished jobs in
    arrival order (running ones carry their placement)."""

    now: float
    shape: ClusterShape
    workloads: Workloads
    active: list[JobProgress]
    jobs: dict[str, ClusterJob]
    at_round: bool = False  # this decision ends one of the policy's rounds

    @property
    def running(self) -> list[JobProgress]:
        return [p for p in self.active if p.placement is not None]

    @property
    def waiting(self) -> list[JobProgress]:
        return [p for p in self.active if p.placement is None]

    def current(self) -> Assignment:
        """The assignment in force (what a non-preemptive policy keeps)."""
        return {p.name: p.placement for p in self.running}


class Policy(Protocol):
    name: str
    round_s: float | None  # re-decide every round; None = at arrivals and finishes only

    def assign(self, view: ClusterView) -> Assignment: ...


@dataclass
class SimulationResult:
    policy: str
    shape: ClusterShape
    jobs: list[JobProgress]
    # (start s, end s, device, job names on it) for every interval a device was held
    timeline: list[tuple[float, float, int, tuple[str, ...]]] = field(default_factory=list)
    decisions: int = 0
    _open: dict[int, int] = field(default_factory=dict, repr=False)  # device -> its last interval

    def hold(self, start: float, end: float, device: int, names: tuple[str, ...]) -> None:
        """Record that ``names`` held ``device`` over [start, end), merged with a contiguous
        interval of the same tenants."""
        last = self._open.get(device)
        if last is not None:
            begin, stop, _, held = self.timeline[last]
            if held == names and stop == start:
                self.timeline[last] = (begin, end, device, names)
                return
        self._open[device] = len(self.timeline)
        self.timeline.append((start, end, device, names))


def simulate(
    jobs: list[ClusterJob],
    shape: ClusterShape,
    workloads: Workloads,
    policy: Policy,
    restart_s: float = RESTART_S,
    progress: Callable[[int, int], None] | None = None,
    start_s: float = 0.0,
) -> SimulationResult:
    """Run ``policy`` over ``jobs`` to the last finish; ``progress(finished, total)`` is called
    as jobs finish. ``start_s`` is lost at a job's first start (a trace's durations already
    hold it; a real run's start-up, as ``legato cluster profile`` measured it, does not)."""
    check_jobs(jobs, shape, workloads)
    by_name = {j.name: j for j in jobs}
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.name))
    states = {j.name: JobProgress(j) for j in jobs}
    result = SimulationResult(policy.name, shape, list(states.values()))
    active: list[JobProgress] = []
    now, nxt, finished = 0.0, 0, 0
    next_round = policy.round_s if policy.round_s else math.inf
    at_round = False
    for _ in range(MAX_EVENTS_PER_JOB * len(jobs)):
        while nxt < len(arrivals) and arrivals[nxt].arrival_s <= now:
            active.append(states[arrivals[nxt].name])
            nxt += 1
        if not active:
            if nxt == len(arrivals):
                return result
            now = arrivals[nxt].arrival_s
            continue
        view = ClusterView(now, shape, workloads, active, by_name, at_round)
        assignment = policy.assign(view)
        result.decisions += 1
        check_assignment(
            assignment, by_name, shape, {n: by_name[n].local_batches(workloads) for n in assignment}
        )
        _apply(active, assignment, now, restart_s, start_s)
        rates = job_rates(assignment, by_name, workloads)
        until = [arrivals[nxt].arrival_s - now if nxt < len(arrivals) else math.inf]
        until.append(next_round - now)
        for name, rate in rates.items():
            state = states[name]
            until.append(state.restart_left_s + state.remaining / rate)
        step = min(until)
        if not math.isfinite(step):
            raise RuntimeError(
                f"policy {policy.name!r} left {len(active)} job(s) waiting on an idle cluster"
            )
        _advance(active, rates, step, now, result)
        now += step
        at_round = now >= next_round
        if at_round:
            next_round = now + policy.round_s
        done = [p for p in active if p.placement is not None and p.remaining <= 1e-9 * p.job.steps]
        for state in done:
            state.done, state.finished_s, state.placement = state.job.steps, now, None
            active.remove(state)
            finished += 1
        if done and progress is not None:
            progress(finished, len(jobs))
    raise RuntimeError(f"policy {policy.name!r}: no end after {MAX_EVENTS_PER_JOB} events per job")


def _apply(
    active: list[JobProgress], assignment: Assignment, now: float, restart_s: float, start_s: float
) -> None:
    for state in active:
        new = assignment.get(state.name)
        old = state.placement
        if new is not None and (old is None or old.devices != new.devices):
            state.since_s = now
            if state.started_s is None:
                state.started_s = now
                state.restart_left_s = start_s
            else:  # resumed after a preemption, or moved: restore from the checkpoint
                state.restarts += 1
                state.restart_left_s = restart_s
        if new is None:
            state.restart_left_s = 0.0
        state.placement = new


def _advance(
    active: list[JobProgress],
    rates: dict[str, float],
    step: float,
    now: float,
    result: SimulationResult,
) -> None:
    held: dict[int, list[str]] = {}
    for state in active:
        if state.placement is None:
            continue
        running = max(0.0, step - state.restart_left_s)
        state.restart_left_s = max(0.0, state.restart_left_s - step)
        state.done = min(state.job.steps, state.done + rates[state.name] * running)
        state.attained_gpu_s += state.job.workers * step
        state.last_run_s = now + step
        for device in state.placement.devices:
            held.setdefault(device, []).append(state.name)
    if step > 0:
        for device, names in sorted(held.items()):
            result.hold(now, now + step, device, tuple(names))
