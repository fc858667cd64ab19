"""``legato cluster run``: the policies of the simulator applied to real legato trainers.

The loop is the simulator's, in wall-clock time: jobs arrive at their ``arrival_s``; at
each arrival, finish, failure or end of a policy round the policy sees the same
``ClusterView`` (progress measured: the steps each trainer has finished) and returns the
whole assignment; the difference to the running one is applied — a job whose devices
change is stopped (its trainer checkpoints) and started again on the new ones (it resumes
from the checkpoint), a changed share is a new CPU quota, a changed split goes to the
running trainer (``Trainer.set_batch_split``). A job that fails is reported and its
devices freed; the others run on. The result is a ``SimulationResult``, so a real run has
the simulator's metrics and pictures, and is set beside the simulator's prediction of the
same jobs (``predict``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from legato.cluster.cpu_share import run_cgroups
from legato.cluster.job_types import JobType, runnable_split, train_config
from legato.cluster.jobs import ClusterJob, ClusterShape, check_jobs
from legato.cluster.placement import Assignment, Placement, check_assignment
from legato.cluster.ray_jobs import Incarnation, launch
from legato.cluster.simulator import ClusterView, JobProgress, Policy, SimulationResult
from legato.cluster.workloads import Workloads

TICK_S = 0.25  # how often the executor polls the trainers


@dataclass
class RunResult:
    """A real run: the simulator's result type, plus what only a real run has."""

    result: SimulationResult
    failures: dict[str, str] = field(default_factory=dict)  # job -> its error
    startup_s: dict[str, list[float]] = field(default_factory=dict)  # job -> launch-to-step
    events: list[str] = field(default_factory=list)
    share_mode: str = ""


class Executor:
    """Run ``jobs`` (each of a type in ``types``) under ``policy`` on a local Ray instance."""

    def __init__(
        self,
        shape: ClusterShape,
        jobs: list[ClusterJob],
        types: dict[str, JobType],
        workloads: Workloads,
        policy: Policy,
        out_dir: str | Path,
        cores_per_device: int = 1,
        say: Callable[[str], None] = print,
    ) -> None:
        check_jobs(jobs, shape, workloads)
        by_key = {kind.key: kind for kind in types.values()}
        for job in jobs:
            if job.job_type not in by_key:
                raise ValueError(f"job {job.name!r}: type {job.job_type!r} is not a legato type")
        self.shape, self.jobs, self.workloads, self.policy = shape, jobs, workloads, policy
        self.kind = {job.name: by_key[job.job_type] for job in jobs}
        self.out_dir = Path(out_dir)
        self.cores_per_device = cores_per_device
        self.say = say
        self.run_id = ""  # the run's cgroup parent, while run() runs
        self.running: dict[str, Incarnation] = {}

    def run(self, progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Run every job to its end under the policy; the workers' cgroups live under one
        parent of this run's, removed when it ends."""
        with run_cgroups("run") as self.run_id:
            return self._run(progress)

    def _run(self, progress: Callable[[int, int], None] | None) -> RunResult:
        by_name = {j.name: j for j in self.jobs}
        states = {j.name: JobProgress(j) for j in self.jobs}
        out = RunResult(SimulationResult(self.policy.name, self.shape, list(states.values())))
        arrivals = sorted(self.jobs, key=lambda j: (j.arrival_s, j.name))
        active: list[JobProgress] = []
        launched_at: dict[str, tuple[float, float]] = {}  # job -> (when, steps then)
        nxt, ended = 0, 0
        round_s = self.policy.round_s
        next_round = round_s if round_s else math.inf
        t0 = time.monotonic()
        last = 0.0
        try:
            while ended < len(self.jobs):
                now = time.monotonic() - t0
                event = False
                while nxt < len(arrivals) and arrivals[nxt].arrival_s <= now:
                    active.append(states[arrivals[nxt].name])
                    self._log(out, now, f"{arrivals[nxt].name} arrives")
                    nxt, event = nxt + 1, True
                for state in list(active):
                    if state.placement is None:
                        continue
                    polled = self.running[state.name].poll()
                    state.done = float(min(p["step"] for p in polled))
                    state.attained_gpu_s += state.job.workers * (now - last)
                    state.last_run_s = now
                    when, steps_then = launched_at.get(state.name, (now, math.inf))
                    if state.done > steps_then:
                        out.startup_s.setdefault(state.name, []).append(now - when)
                        launched_at.pop(state.name)
                    error = next((p["error"] for p in polled if p["error"]), None)
                    if error or all(p["finished"] for p in polled):
                        self._end(state, now, out, active, error)
                        ended, event = ended + 1, True
                for device, names in _held(active).items():
                    out.result.hold(last, now, device, names)
                at_round = bool(round_s) and now >= next_round
                if at_round:
                    next_round, event = now + round_s, True
                if event and active:
                    view = ClusterView(now, self.shape, self.workloads, active, by_name, at_round)
                    assignment = self.policy.assign(view)
                    out.result.decisions += 1
                    check_assignment(
                        assignment, by_name, self.shape,
                        {n: by_name[n].local_batches(self.workloads) for n in assignment},
                    )  # fmt: skip
                    for state in self._apply(assignment, active, now, out, launched_at):
                        self._fail(state, now, out, active)
                        ended += 1
                    if progress is not None:
                        progress(ended, len(self.jobs))
                last = now
                time.sleep(TICK_S)
        finally:
            for incarnation in self.running.values():
                incarnation.release()
            self.running.clear()
        return out

    # ------------------------------------------------------------------ applying decisions

    def _apply(
        self,
        assignment: Assignment,
        active: list[JobProgress],
        now: float,
        out: RunResult,
        launched_at: dict[str, tuple[float, float]],
    ) -> list[JobProgress]:
        """Carry ``assignment`` out; the jobs that failed doing so (their error recorded)."""
        failed = []
        for state in active:  # stops first: a move's devices may be another job's new ones
            new, old = assignment.get(state.name), state.placement
            if old is not None and (new is None or new.devices != old.devices):
                incarnation = self.running.pop(state.name)
                polled = incarnation.stop()
                incarnation.release()
                state.done = float(min(p["step"] for p in polled))
                state.placement = None
                error = next((p["error"] for p in polled if p["error"]), None)
                if error or not all(p["finished"] for p in polled):  # no checkpoint to resume
                    out.failures[state.name] = error or "did not stop (and checkpoint) in time"
                    failed.append(state)
                    continue
                what = "moved" if new else "preempted"
                self._log(out, now, f"{state.name} {what} after step {state.done:.0f}")
        slots = self._slots(assignment)
        for state in active:
            new, old = assignment.get(state.name), state.placement
            if new is None or state in failed:
                continue
            split = self._split(state.job, new)
            try:
                if old is None:
                    self._start(state, new, split, slots, now, out)
                    launched_at[state.name] = (now, state.done)
                    continue
                incarnation = self.running[state.name]
                if new.shares != old.shares:
                    incarnation.set_share(new.shares)
                    self._log(out, now, f"{state.name} shares {', '.join(incarnation.shares)}")
                if split != self._split(state.job, old):
                    incarnation.set_split(split)
                    self._log(out, now, f"{state.name} local batches {list(split)}")
            except Exception as exc:  # a launch or a call that failed: this job only
                out.failures[state.name] = f"{type(exc).__name__}: {exc}"
                failed.append(state)
                continue
            state.placement = new
        return failed

    def _slots(self, assignment: Assignment) -> dict[tuple[str, int], int]:
        """Each worker's place among its device's tenants: running workers keep theirs, a
        new one takes the lowest free (two core-capped tenants must not share cores)."""
        held: dict[int, set[int]] = {}
        slots: dict[tuple[str, int], int] = {}
        for name, incarnation in self.running.items():
            for worker, (device, slot) in enumerate(
                zip(incarnation.devices, incarnation.slots, strict=True)
            ):
                held.setdefault(device, set()).add(slot)
                slots[(name, worker)] = slot
        for name, placement in assignment.items():
            if name in self.running:
                continue
            for worker, device in enumerate(placement.devices):
                taken = held.setdefault(device, set())
                slot = min(set(range(len(taken) + 1)) - taken)
                taken.add(slot)
                slots[(name, worker)] = slot
        return slots

    def _fail(self, state: JobProgress, now: float, out: RunResult, active) -> None:
        incarnation = self.running.pop(state.name, None)
        if incarnation is not None:
            incarnation.release()
        active.remove(state)
        state.placement = None
        self._log(
            out, now, f"{state.name} FAILED: {out.failures[state.name]}; its devices are freed"
        )

    def _start(self, state, placement, split, slots, now, out) -> None:
        job = state.job
        config = train_config(
            self.kind[job.name], int(job.steps), job.workers, job.local_batches(self.workloads),
            self.out_dir / "jobs" / job.name, split,
        )  # fmt: skip
        worker_slots = tuple(slots[(job.name, w)] for w in range(job.workers))
        incarnation = launch(
            job.name, config, placement.devices, placement.shares, worker_slots,
            self.cores_per_device, self.run_id, now,
        )  # fmt: skip
        self.running[job.name] = incarnation
        if state.started_s is None:
            state.started_s = now
        else:
            state.restarts += 1
        state.since_s, state.placement = now, placement
        out.share_mode = incarnation.shares[0]
        self._log(
            out, now,
            f"{job.name} starts on devices {list(placement.devices)} at step {state.done:.0f}, "
            f"local batches {list(split)}, shares: {'; '.join(incarnation.shares)}",
        )  # fmt: skip

    def _split(self, job: ClusterJob, placement: Placement) -> tuple[int, ...]:
        batch = job.local_batches(self.workloads)
        split = placement.split or tuple(batch // job.workers for _ in range(job.workers))
        return runnable_split(split, batch)

    def _end(self, state, now, out, active, error) -> None:
        incarnation = self.running.pop(state.name)
        incarnation.release()
        active.remove(state)
        state.placement = None
        if error:
            out.failures[state.name] = error
            self._log(out, now, f"{state.name} FAILED: {error}; its devices are freed")
            return
        state.done, state.finished_s = state.job.steps, now
        self._log(out, now, f"{state.name} finished, JCT {now - state.job.arrival_s:.1f} s")

    def _log(self, out: RunResult, now: float, line: str) -> None:
        text = f"[{now:7.1f} s] {line}"
        out.events.append(text)
        self.say(text)


def _held(active: list[JobProgress]) -> dict[int, tuple[str, ...]]:
    held: dict[int, list[str]] = {}
    for state in active:
        if state.placement is not None:
            for device in state.placement.devices:
                held.setdefault(device, []).append(state.name)
    return {d: tuple(names) for d, names in sorted(held.items())}
