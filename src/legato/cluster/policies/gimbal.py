"""Gimbal (TACO'25): flexible packing with per-worker squeeze and swell.

Placement. Jobs are ordered by the objective (shortest estimated remaining time first for
mean JCT, earliest deadline for deadlines, longest first for makespan) and start on devices
of their own, consolidated, when they fit; nothing is preempted. A job that does not fit is
packed as a *guest* beside one running *host* with at least as many workers (``unequal``;
equal sizes only when off): all its workers on the host's unshared devices, on as few nodes
as possible, at most two workers per device. A host keeps several guests and a guest hosts
nobody, so each packing set is a star around its largest job. The host chosen is the one
whose set gains most normalised throughput (each job's rate over its exclusive rate,
weighted by workers); a pack that gains nothing is not made.

Calibration (per star, whenever its membership changes). Input-sample stealing (``stealing``)
re-splits each job's fixed global batch in proportion to its workers' speeds, so a host's
packed workers do not become stragglers. Resource restriction (``restriction``) sets each
guest's share of its devices in 10% steps by greedy search: each trial tries one squeeze or
swell of one guest and keeps it if the star's objective improves; the search stops after
``patience`` trials in a row without gain (the paper's rule, 3), or searches the whole grid
(``patience = None``; coordinate descent to a fixed point beyond three guests). The
objective of a star: mean of remaining / rate (JCT), the largest (makespan), or the summed
lateness past the deadlines (deadline).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from legato.cluster.placement import Assignment, Placement, tenants
from legato.cluster.policies.common import (
    consolidated,
    estimated_remaining_s,
    exclusive_rate,
    place_exclusive,
)
from legato.cluster.simulator import ClusterView, JobProgress
from legato.cluster.speed import job_rates, stealing_split, worker_speeds
from legato.errors import ConfigError

OBJECTIVES = ("jct", "deadline", "makespan")
SHARE_STEP = 0.1
SHARES = tuple(round(SHARE_STEP * i, 1) for i in range(1, 10))
# A pack must gain this many device-equivalents per guest worker: the bar of Lucid's rule
# (two jobs each at 0.7 of solo gain 0.4), so Gimbal differs from Lucid in which jobs may
# pack (unequal sizes) and in calibrating them, not in a looser bar.
MIN_GAIN = 0.4
PACK_WINDOW = 8  # waiting jobs, from the head of the queue, tried as guests per decision
FULL_GRID_GUESTS = 3  # above this many guests the full search is coordinate descent


@dataclass
class Gimbal:
    objective: str = "jct"
    unequal: bool = True
    stealing: bool = True
    restriction: bool = True
    patience: int | None = 3
    name: str = "gimbal"
    round_s: float | None = None
    trials: int = 0  # calibration trials run (each one a few measured steps on real devices)
    _calibrated: dict[tuple, tuple[dict, dict]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"--objective: unknown objective {self.objective!r}; choose one of "
                f"{', '.join(OBJECTIVES)}"
            )

    def assign(self, view: ClusterView) -> Assignment:
        order = sorted(view.waiting, key=lambda s: (self._priority(view, s), s.name))
        assignment = {
            n: Placement(p.devices) for n, p in view.current().items()
        }  # calibration is redone below, for the stars as they are now
        assignment = place_exclusive(view, assignment, order)
        for state in [s for s in order if s.name not in assignment][:PACK_WINDOW]:
            self._pack(view, assignment, state)
        for star in _stars(view, assignment):
            self._calibrate(view, assignment, star)
        return assignment

    # ------------------------------------------------------------------ placement

    def _priority(self, view: ClusterView, state: JobProgress) -> float:
        if self.objective == "deadline":
            return state.job.deadline_s if state.job.deadline_s is not None else math.inf
        remaining = estimated_remaining_s(view, state)
        return -remaining if self.objective == "makespan" else remaining

    def _pack(self, view: ClusterView, assignment: Assignment, guest: JobProgress) -> None:
        """Pack ``guest`` beside the host whose star gains most throughput, if any gains
        ``MIN_GAIN`` per guest worker."""
        on = tenants(assignment)
        guests = {name for star in _stars(view, assignment) for name in star[1:]}
        best, best_gain = None, MIN_GAIN * guest.job.workers
        for host, placement in sorted(assignment.items()):
            job = view.jobs[host]
            if host in guests or job.workers < guest.job.workers:
                continue
            if not self.unequal and job.workers != guest.job.workers:
                continue
            if view.workloads.pair_speeds(guest.job.job_type, job.job_type) is None:
                continue
            alone = {d for d in placement.devices if len(on[d]) == 1}
            devices = consolidated(view.shape, alone, guest.job.workers)
            if devices is None:
                continue
            trial = {**assignment, guest.name: Placement(devices)}
            star = (host, *(n for n in trial if n != host and _shares_with(trial, n, host)))
            gain = self._gain(view, trial, star, guest.name)
            if gain >= best_gain:
                best, best_gain = devices, gain
        if best is not None:
            assignment[guest.name] = Placement(best)

    def _gain(self, view: ClusterView, trial: Assignment, star: tuple, guest: str) -> float:
        """Device-equivalents of work per second the star gains with the guest (each job's
        rate over its exclusive rate, times its workers; uncalibrated but for sample
        stealing, which costs nothing)."""
        with_guest = job_rates(
            self._with_splits(view, {n: trial[n] for n in star}), view.jobs, view.workloads
        )
        alone = {n: trial[n] for n in star if n != guest}
        without = job_rates(self._with_splits(view, alone), view.jobs, view.workloads)
        gain = 0.0
        for name in star:
            job = view.jobs[name]
            delta = with_guest[name] - without.get(name, 0.0)
            gain += job.workers * delta / exclusive_rate(view, job)
        return gain

    def _finish_times(self, view: ClusterView, sub: Assignment) -> dict[str, float]:
        """Seconds from now until each job of the star ends, phase by phase: when one ends
        the others speed up (re-split; shares are recalibrated, so dropped)."""
        states = {s.name: s for s in view.active}
        left = {n: _remaining(states, view, n) for n in sub}
        clock, ends = 0.0, {}
        while sub:
            rates = job_rates(self._with_splits(view, sub), view.jobs, view.workloads)
            step, first = min((left[n] / rates[n], n) for n in sub)
            clock += step
            for n in sub:
                left[n] -= rates[n] * step
            ends[first] = clock
            sub = {n: Placement(p.devices) for n, p in sub.items() if n != first}
        return ends

    def _objective(self, view: ClusterView, ends: dict[str, float]) -> float:
        """Lower is better: summed JCT, the last end (makespan) or the summed lateness."""
        if self.objective == "makespan":
            return max(ends.values())
        if self.objective == "deadline":
            late = 0.0
            for n, t in ends.items():
                due = view.jobs[n].deadline_s
                late += max(0.0, view.now + t - due) if due is not None else 0.0
            return late + 1e-6 * sum(ends.values())
        return sum(ends.values())

    # ------------------------------------------------------------------ calibration

    def _with_splits(self, view: ClusterView, sub: Assignment) -> Assignment:
        if not self.stealing:
            return sub
        speeds = worker_speeds(sub, view.jobs, view.workloads)
        return {
            n: p.with_calibration(p.shares, stealing_split(view.jobs[n], speeds[n], view.workloads))
            for n, p in sub.items()
        }

    def _calibrate(self, view: ClusterView, assignment: Assignment, star: tuple) -> None:
        key = tuple((n, assignment[n].devices) for n in star)
        if key not in self._calibrated:
            guests = star[1:]
            best = {g: None for g in guests}
            if self.restriction and guests:
                best = self._search(view, assignment, star, best)
            sub = self._with_splits(view, self._configured(view, assignment, star, best))
            self._calibrated[key] = (
                {n: sub[n].shares for n in star},
                {n: sub[n].split for n in star},
            )
        shares, splits = self._calibrated[key]
        for n in star:
            assignment[n] = assignment[n].with_calibration(shares[n], splits[n])

    def _configured(self, view, assignment, star, guest_shares: dict) -> Assignment:
        """The star with each guest at its share (the host takes the rest of each device)."""
        host = star[0]
        sub = {n: Placement(assignment[n].devices) for n in star}
        host_devices = sub[host].devices
        host_shares: list[float | None] = [None] * len(host_devices)
        restricted = False
        for guest, share in guest_shares.items():
            if share is None:
                continue
            restricted = True
            sub[guest] = Placement(sub[guest].devices, (share,) * len(sub[guest].devices))
            for d in sub[guest].devices:
                host_shares[host_devices.index(d)] = round(1.0 - share, 1)
        if restricted:
            sub[host] = Placement(host_devices, tuple(host_shares))
        return sub

    def _score(self, view: ClusterView, sub: Assignment) -> float:
        return self._objective(view, self._finish_times(view, sub))

    def _search(self, view, assignment, star, start: dict) -> dict:
        guests = list(start)

        def score(shares: dict) -> float:
            self.trials += 1
            return self._score(view, self._configured(view, assignment, star, shares))

        if self.patience is None and len(guests) <= FULL_GRID_GUESTS:
            grid = itertools.product((None, *SHARES), repeat=len(guests))
            return min((dict(zip(guests, g, strict=True)) for g in grid), key=score)
        best, best_score = dict(start), score(start)
        misses = 0
        for guest, direction in itertools.cycle(itertools.product(guests, (-1, 1))):
            moved = _step(best, guest, direction, view, assignment, star)
            if moved is None:
                misses += 1
            else:
                value = score(moved)
                if value < best_score - 1e-12:
                    best, best_score, misses = moved, value, 0
                else:
                    misses += 1
            limit = self.patience if self.patience is not None else 2 * len(guests)
            if misses >= limit:
                return best
        raise AssertionError("unreachable")


def _step(shares: dict, guest: str, direction: int, view, assignment, star) -> dict | None:
    """``shares`` with ``guest`` squeezed (-1) or swelled (+1) one step; None at the edge."""
    current = shares[guest]
    if current is None:  # start from its natural share, rounded to the grid
        host = star[0]
        natural = view.workloads.pair_speeds(view.jobs[guest].job_type, view.jobs[host].job_type)
        current = round(natural[0] / sum(natural), 1)
    value = round(current + direction * SHARE_STEP, 1)
    if not SHARE_STEP <= value <= 1 - SHARE_STEP:
        return None
    return {**shares, guest: value}


def _remaining(states: dict[str, JobProgress], view: ClusterView, name: str) -> float:
    state = states.get(name)
    return state.remaining if state is not None else view.jobs[name].steps


def _shares_with(assignment: Assignment, a: str, b: str) -> bool:
    return bool(set(assignment[a].devices) & set(assignment[b].devices))


def _stars(view: ClusterView, assignment: Assignment) -> list[tuple[str, ...]]:
    """Each packing set as (host, guests...): on a shared device the job with more workers
    (the earlier-started on a tie) is the host."""
    hosts: dict[str, list[str]] = {}
    for on in tenants(assignment).values():
        if len(on) < 2:
            continue
        (a, _), (b, _) = on
        host, guest = sorted((a, b), key=lambda n: (-view.jobs[n].workers, _start(view, n), n))
        hosts.setdefault(host, [])
        if guest not in hosts[host]:
            hosts[host].append(guest)
    return [(h, *sorted(g)) for h, g in sorted(hosts.items())]


def _start(view: ClusterView, name: str) -> float:
    for state in view.active:
        if state.name == name and state.started_s is not None:
            return state.started_s
    return math.inf
