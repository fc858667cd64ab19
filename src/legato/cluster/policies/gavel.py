"""Gavel (Narayanan et al., OSDI'20): the makespan policy with space sharing, realised by
Gavel's round-based mechanism.

Each piece implements one rule of the paper:

- The allocation (Gavel's "minimize makespan" policy, heterogeneity-agnostic since the
  cluster has one device type, with space sharing): variables ``X_c``, the fraction of
  time each *combination* ``c`` runs, a combination being one job alone or a packable pair
  of jobs with equal worker counts (each worker of one on a device of the other). The LP
  maximises ``t`` subject to, for every active job ``j``,
  ``sum_{c ∋ j} X_c * rate_j(c) >= t * remaining_j`` (so ``1/t`` is the makespan),
  ``sum_{c ∋ j} X_c <= 1``, ``sum_c X_c * workers(c) <= devices``, ``X >= 0``.
  ``rate_j(c)`` is the shared speed model (``job_rates``) on a placement of ``c``; the LP
  is solved with HiGHS (``scipy.optimize.linprog``). Rates and remaining work are measured
  in the job's exclusive seconds, which rescales each row without changing the optimum.
  The LP is degenerate off its critical jobs (any share that finishes them by the makespan
  is optimal) and an arbitrary vertex can leave devices idle, so a second LP picks, among
  the makespan-optimal allocations, the one doing the most work (our tie-break; Gavel's
  paper does not name one).
- Candidate pairs: Gavel considers every pair; to keep the LP small each job brings its
  ``partners`` best partners by combined normalised speed (the pair's speeds from
  ``Workloads.pair_speeds``, summed). A pair whose sum is <= 1 is never a candidate: it
  delivers less than running the two jobs in turn, so the LP would not use it.
- When every active job fits the cluster on devices of its own, the LP is skipped: the
  optimum is then everyone alone (``X = 1``), which no pack beats, packing slowing both.
- The mechanism (Gavel's round-based scheduling, rounds of ``round_s`` = 360 s): the
  priority of a combination is ``X_c`` over the share of time it has received so far (its
  seconds run over the seconds since it was first allocated); each round combinations are
  taken greedily by priority (ties: larger ``X_c`` first) while devices remain, a job in
  at most one
  combination per round, and placed on consolidated free devices. A combination that runs
  on as it ran keeps its devices, and a job that keeps running keeps its devices where
  they are free (no needless migration).

Simplified: Gavel re-solves the LP when jobs arrive or finish and schedules only at round
boundaries; here the LP is re-solved every round and, between rounds, only when a new job
could use a free device; between rounds running jobs keep running and freed devices go to
combinations of waiting jobs by the same priorities. The mechanism is work conserving:
devices left idle after the prioritised combinations go to waiting jobs alone (in arrival
order). Gavel's received time counts whole rounds; here it counts the seconds a
combination actually ran. Both the time received and the time elapsed carry a prior of one
round at the combination's own share, so a new combination starts at priority 1 (on
schedule) instead of Gavel's "never run = infinite", which, with the LP re-solved each
round and new pairs appearing in it, let a stream of tiny-``X`` newcomers starve the
critical job (its makespan went from the lower bound 30,900 s to 41,370 s on the
200-job trace). A combination with ``X_c = 1`` runs every round: no share can put it
ahead of its allocation. Restart costs are not in the LP (nor in Gavel's).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from legato.cluster.placement import Assignment, Placement, tenants
from legato.cluster.policies.common import consolidated, exclusive_rate, free_devices
from legato.cluster.simulator import ClusterView
from legato.cluster.speed import job_rates
from legato.cluster.workloads import Workloads

ROUND_S = 360.0  # Gavel's round
PARTNERS = 4  # candidate partners per job in the LP
_EPS = 1e-9

Combination = tuple[str, ...]  # one job, or a pair of job names in sorted order


class Gavel:
    name = "gavel"

    def __init__(self, round_s: float = ROUND_S, partners: int = PARTNERS) -> None:
        self.round_s = round_s
        self.partners = partners
        self._workloads: Workloads | None = None
        self._rates: dict[tuple, tuple[float, ...]] = {}  # job kinds -> normalised rates
        self._reset()

    def _reset(self) -> None:
        self._received: dict[Combination, float] = {}  # seconds each combination has run
        self._allocation: dict[Combination, float] = {}
        self._since: dict[Combination, float] = {}  # when each was first allocated
        self._last_now = 0.0

    def assign(self, view: ClusterView) -> Assignment:
        if view.now < self._last_now:  # a new simulation with this object
            self._reset()
        self._credit(view)
        round_due = view.at_round
        fixed = {} if round_due else view.current()
        has_free = len(free_devices(view.shape, fixed)) > 0
        unplaced = [s.name for s in view.active if s.name not in fixed]
        known = {n for c in self._allocation for n in c}
        if round_due or (has_free and any(n not in known for n in unplaced)):
            self._allocation, _ = self.allocation(view)
            for combo in self._allocation:
                self._since.setdefault(combo, view.now)
        return self._realise(view, fixed)

    # -- the LP -----------------------------------------------------------------------------

    def allocation(self, view: ClusterView) -> tuple[dict[Combination, float], float]:
        """The makespan-optimal time fractions ``X_c`` of the active jobs' combinations and
        the makespan they give (seconds from now, restarts not counted)."""
        active = view.active
        if not active:
            return {}, 0.0
        exclusive = {s.name: exclusive_rate(view, s.job) for s in active}
        need = {s.name: s.remaining / exclusive[s.name] for s in active}  # exclusive seconds
        if sum(s.job.workers for s in active) <= view.shape.devices:
            return {(s.name,): 1.0 for s in active}, max(need.values())
        combos: list[Combination] = [(s.name,) for s in active]
        combos += self.candidate_pairs(view)
        index = {s.name: i for i, s in enumerate(active)}
        n, m = len(active), len(combos)
        scale = max(need.values())
        rows, cols, vals = [], [], []
        throughput = np.zeros(m + 1)  # exclusive seconds of work a unit of X_c does
        for k, combo in enumerate(combos):
            for name, rate in zip(combo, self._combo_rates(view, combo), strict=True):
                throughput[k] += rate
                j = index[name]
                rows += [j, n + j]  # its progress row, its time row
                cols += [k, k]
                vals += [-rate, 1.0]
            rows.append(2 * n)  # the devices row
            cols.append(k)
            vals.append(float(view.jobs[combo[0]].workers))
        for j, s in enumerate(active):
            rows.append(j)
            cols.append(m)
            vals.append(need[s.name] / scale)
        matrix = csr_matrix((vals, (rows, cols)), shape=(2 * n + 1, m + 1))
        bounds = np.concatenate([np.zeros(n), np.ones(n), [view.shape.devices]])
        objective = np.zeros(m + 1)
        objective[m] = -1.0
        best = self._solve(objective, matrix, bounds, (0.0, None))
        # among the makespan-optimal allocations, the one doing the most work (the LP is
        # degenerate off its critical jobs; an arbitrary vertex can idle devices)
        x = self._solve(-throughput, matrix, bounds, (best[m] * (1 - 1e-7), None))
        x = np.clip(x[:m], 0.0, 1.0)
        allocation = {c: float(v) for c, v in zip(combos, x, strict=True) if v > _EPS}
        return allocation, scale / best[m]

    @staticmethod
    def _solve(objective, matrix, bounds, t_bounds) -> np.ndarray:
        variables = [(0.0, None)] * (len(objective) - 1) + [t_bounds]
        result = linprog(objective, A_ub=matrix, b_ub=bounds, bounds=variables, method="highs")
        if result.status != 0 or result.x[-1] <= _EPS:  # cannot happen for a feasible view
            raise RuntimeError(f"gavel: the makespan LP failed ({result.message})")
        return result.x

    def candidate_pairs(self, view: ClusterView) -> list[Combination]:
        """Each active job's ``partners`` best packable partners (same worker count, combined
        normalised speed > 1, best first; ties in arrival order), as sorted name pairs."""
        groups: dict[int, dict[str, list[str]]] = {}  # workers -> type -> names, arrival order
        for s in view.active:
            groups.setdefault(s.job.workers, {}).setdefault(s.job.job_type, []).append(s.name)
        gain: dict[tuple[str, str], float] = {}
        pairs: set[Combination] = set()
        for s in view.active:
            by_type = groups[s.job.workers]
            scored = []
            for other_type in by_type:
                key = (s.job.job_type, other_type)
                if key not in gain:
                    speeds = view.workloads.pair_speeds(*key)
                    gain[key] = 0.0 if speeds is None else speeds[0] + speeds[1]
                if gain[key] > 1.0:
                    scored.append((-gain[key], other_type))
            taken = 0
            for _, other_type in sorted(scored):
                for other in by_type[other_type]:
                    if other == s.name:
                        continue
                    pairs.add(tuple(sorted((s.name, other))))
                    taken += 1
                    if taken == self.partners:
                        break
                if taken == self.partners:
                    break
        return sorted(pairs)

    def _combo_rates(self, view: ClusterView, combo: Combination) -> tuple[float, ...]:
        """Each member's rate in ``combo`` over its exclusive rate (the speed model)."""
        jobs = [view.jobs[n] for n in combo]
        key = tuple((j.job_type, j.workers, j.global_batch) for j in jobs)
        self._check_workloads(view.workloads)
        if key not in self._rates:
            devices = tuple(range(jobs[0].workers))
            placed = {j.name: Placement(devices) for j in jobs}
            rates = job_rates(placed, {j.name: j for j in jobs}, view.workloads)
            self._rates[key] = tuple(rates[j.name] / exclusive_rate(view, j) for j in jobs)
        return self._rates[key]

    def _check_workloads(self, workloads: Workloads) -> None:
        if workloads is not self._workloads:
            self._workloads, self._rates = workloads, {}

    # -- the round-based mechanism ----------------------------------------------------------

    def priority(self, view: ClusterView, combo: Combination) -> float:
        """``X_c`` over the share of time ``combo`` has received since it was first
        allocated, both counted with one round of its due share as a prior: one that has
        had exactly its share, or is new, gets 1; one that is owed time more. One given
        the whole time (``X_c = 1``) is never ahead of its share: it runs every round."""
        x = self._allocation[combo]
        if x >= 1.0 - 1e-6:
            return math.inf
        elapsed = view.now - self._since.get(combo, view.now)
        prior = x * self.round_s
        return x * (elapsed + self.round_s) / (self._received.get(combo, 0.0) + prior)

    def _realise(self, view: ClusterView, fixed: Assignment) -> Assignment:
        active = {s.name for s in view.active}
        order = sorted(
            (c for c in self._allocation if all(n in active and n not in fixed for n in c)),
            key=lambda c: (-self.priority(view, c), -self._allocation[c], c),
        )
        budget = len(free_devices(view.shape, fixed))
        taken: set[str] = set()
        chosen: list[Combination] = []
        for combo in order:
            workers = view.jobs[combo[0]].workers
            if workers > budget or taken.intersection(combo):
                continue
            chosen.append(combo)
            taken.update(combo)
            budget -= workers
        assignment = dict(fixed)
        free = free_devices(view.shape, assignment)
        placed = view.current()
        now_on = _combinations(placed)
        left = []
        for combo in chosen:  # a combination that runs on as it ran keeps its devices
            devices = now_on.get(combo)
            if devices is not None and set(devices) <= free:
                _place(assignment, free, combo, devices)
            else:
                left.append(combo)
        later = []
        for combo in left:  # a member that keeps running keeps its devices where free
            held = [placed.get(n) for n in combo]
            devices = next((p.devices for p in held if p and set(p.devices) <= free), None)
            if devices is not None:
                _place(assignment, free, combo, devices)
            else:
                later.append(combo)
        for combo in later:
            devices = consolidated(view.shape, free, view.jobs[combo[0]].workers)
            _place(assignment, free, combo, devices)
        for s in view.active:  # work conserving: idle devices to waiting jobs, alone
            if s.name not in assignment:
                devices = consolidated(view.shape, free, s.job.workers)
                if devices is not None:
                    _place(assignment, free, (s.name,), devices)
        return assignment

    def _credit(self, view: ClusterView) -> None:
        """Add the time since the last decision to every combination that ran in it."""
        elapsed = view.now - self._last_now
        self._last_now = view.now
        if elapsed <= 0:
            return
        for combo in _combinations(view.current()):
            self._received[combo] = self._received.get(combo, 0.0) + elapsed


def _combinations(assignment: Assignment) -> dict[Combination, tuple[int, ...]]:
    """The combinations an assignment runs (the jobs sharing each job's devices) and their
    devices."""
    on = tenants(assignment)
    out = {}
    for name, placement in assignment.items():
        names = {n for d in placement.devices for n, _ in on[d]} | {name}
        out[tuple(sorted(names))] = placement.devices
    return out


def _place(
    assignment: Assignment, free: set[int], combo: Combination, devices: tuple[int, ...]
) -> None:
    for name in combo:
        assignment[name] = Placement(devices)
    free -= set(devices)
