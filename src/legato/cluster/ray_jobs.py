"""legato jobs on Ray: each data-parallel worker a Ray actor running a ``Trainer``.

One *incarnation* of a job is its workers on one set of devices, from start to stop: a
placement group reserves one tenant slot of each device (custom resources
``legato_device_<d>``, ``MAX_TENANTS`` per device, so Ray itself refuses a third tenant),
then one actor per bundle pins itself to its device's cores, joins the job's own gloo/NCCL
group (rank 0's actor picks the rendezvous port) and runs ``Trainer.fit()`` in a thread, so
the actor still answers ``poll``, ``set_share``, ``set_split`` and ``stop`` while it trains.
A move or a preemption stops the incarnation (the trainer checkpoints the step it stopped
after) and starts another, which resumes from that checkpoint: no sample is lost or seen
twice. On a Ray cluster the same code runs unchanged when every node is started with its
devices' resources (docs/cluster.md).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legato.cluster.cpu_share import CpuShare, cores_of, remove_cgroup_tree
from legato.cluster.placement import MAX_TENANTS
from legato.errors import ConfigError
from legato.local_ray import local_ray

DEVICE_RESOURCE = "legato_device_{}"
START_TIMEOUT_S = 120.0  # actors placed and the process group joined
STOP_TIMEOUT_S = 60.0  # a stop: the step under way plus the checkpoint
CALL_TIMEOUT_S = 30.0  # a call to a running worker: poll, share, split (answered between steps)


class TrainerWorker:
    """One worker of one incarnation (the class Ray turns into an actor)."""

    def __init__(self, cgroup: str, device: int, cores_per_device: int, slot: int) -> None:
        cores = cores_of(device, cores_per_device, os.cpu_count() or 1)
        self.cpu = CpuShare.create(cgroup, cores, slot)
        self.trainer: Any = None
        self.error: str | None = None
        self.finished = False

    def address(self) -> tuple[str, int]:
        """Where the job's rendezvous listens: this host and a port free now."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return host, probe.getsockname()[1]

    def start(
        self, config: Any, rank: int, world: int, master: tuple[str, int], share: float | None
    ) -> str:
        """Join the job's process group as ``rank`` of ``world`` and train in a thread; the
        line that says how the share is enforced."""
        from legato.train.trainer import Trainer

        self.cpu.apply(share)
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master[0], MASTER_PORT=str(master[1]),
        )  # fmt: skip
        self.trainer = Trainer(config)
        threading.Thread(target=self._fit, name="legato-trainer", daemon=True).start()
        # started means the layout is resolved: a split or a stop sent right after this
        # returns reaches a trainer that can take it (under load, set-up takes seconds)
        if not self.trainer.layout_resolved.wait(START_TIMEOUT_S):
            raise TimeoutError(f"rank {rank}: no layout after {START_TIMEOUT_S:.0f} s")
        return self.cpu.describe(share)

    def _fit(self) -> None:
        try:
            self.trainer.fit()
        except BaseException as exc:  # reported by poll: the executor frees the job's devices
            self.error = f"{type(exc).__name__}: {exc}"
        self.finished = True

    def poll(self) -> dict[str, Any]:
        step = self.trainer.last_step if self.trainer is not None else 0
        return {"step": step, "finished": self.finished, "error": self.error}

    def set_share(self, share: float | None) -> str:
        self.cpu.apply(share)
        return self.cpu.describe(share)

    def set_split(self, split: list[int]) -> None:
        self.trainer.set_batch_split(split)

    def stop(self) -> None:
        if self.trainer is not None:
            self.trainer.request_stop()

    def cgroup(self) -> str | None:
        return None if self.cpu.cgroup is None else str(self.cpu.cgroup)


@dataclass
class Incarnation:
    """A job's workers on one set of devices (see the module docstring)."""

    job: str
    devices: tuple[int, ...]
    actors: list[Any]
    group: Any
    cgroups: list[str | None]
    started_s: float
    shares: list[str] = field(default_factory=list)
    slots: tuple[int, ...] = ()  # each worker's place among its device's tenants

    def poll(self, timeout_s: float = CALL_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every worker's state; a dead actor reads as a failed worker."""
        import ray

        states = []
        for actor in self.actors:
            try:
                states.append(ray.get(actor.poll.remote(), timeout=timeout_s))
            except (ray.exceptions.RayError, TimeoutError) as exc:
                states.append({"step": 0, "finished": True, "error": f"worker lost: {exc}"})
        return states

    def set_share(self, shares: tuple[float | None, ...] | None) -> None:
        import ray

        values = shares or (None,) * len(self.actors)
        self.shares = ray.get(
            [a.set_share.remote(s) for a, s in zip(self.actors, values, strict=True)],
            timeout=CALL_TIMEOUT_S,
        )

    def set_split(self, split: tuple[int, ...]) -> None:
        import ray

        # rank 0's reaches every rank
        ray.get(self.actors[0].set_split.remote(list(split)), timeout=CALL_TIMEOUT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> list[dict[str, Any]]:
        """Ask the trainers to stop after the step under way (they checkpoint it) and wait."""
        for actor in self.actors:
            actor.stop.remote()
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.poll()
            if all(s["finished"] for s in states) or time.monotonic() > deadline:
                return states
            time.sleep(0.1)

    def release(self) -> None:
        """Kill the actors, free the placement group and remove the workers' cgroups."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.group)
        for path in self.cgroups:
            if path is not None:
                remove_cgroup_tree(Path(path))


def launch(
    job: str,
    config: Any,
    devices: tuple[int, ...],
    shares: tuple[float | None, ...] | None,
    slots: tuple[int, ...],
    cores_per_device: int,
    run_id: str,
    now_s: float,
) -> Incarnation:
    """Start ``job``'s workers on ``devices`` (worker i on ``devices[i]``, ``slots[i]`` its
    place among that device's tenants) and wait until they are placed."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = [{DEVICE_RESOURCE.format(d): 1} for d in devices]
    group = placement_group(bundles, strategy="PACK", name=f"{run_id}-{job}")
    actor_class = ray.remote(num_cpus=0, max_concurrency=4)(TrainerWorker)
    stamp = int(time.time() * 1000)
    actors: list[Any] = []
    try:
        ray.get(group.ready(), timeout=START_TIMEOUT_S)
        for i, d in enumerate(devices):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
            actors.append(actor_class.options(scheduling_strategy=strategy).remote(
                f"{run_id}/{job}-w{i}-{stamp}", d, cores_per_device, slots[i]))  # fmt: skip
        master = ray.get(actors[0].address.remote(), timeout=START_TIMEOUT_S)
        values = shares or (None,) * len(devices)
        described = ray.get(
            [
                a.start.remote(config, r, len(devices), master, values[r])
                for r, a in enumerate(actors)
            ],
            timeout=START_TIMEOUT_S,
        )
        cgroups = ray.get([a.cgroup.remote() for a in actors], timeout=CALL_TIMEOUT_S)
    except BaseException:  # nothing of a half-started incarnation may outlive it
        Incarnation(job, tuple(devices), actors, group, [], now_s).release()
        raise
    return Incarnation(job, tuple(devices), actors, group, cgroups, now_s, described, tuple(slots))


@contextmanager
def ray_session(devices: int, cores_per_device: int, address: str | None = None) -> Iterator[None]:
    """Connect to ``address`` (a Ray cluster whose nodes advertise ``legato_device_<d>``), or
    start a Ray instance on this host's loopback with its ``devices``, for the ``with`` block;
    a Ray this call started is shut down when the block ends, one already running is kept."""
    import ray

    if ray.is_initialized():
        yield
        return
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)  # fmt: skip
        try:
            yield
        finally:
            ray.shutdown()
        return
    host = os.cpu_count() or 1
    if devices * cores_per_device > host:
        raise ConfigError(
            f"--cores-per-device: {devices} devices of {cores_per_device} core(s) need "
            f"{devices * cores_per_device} cores; this host has {host}"
        )
    with local_ray(host, {DEVICE_RESOURCE.format(d): MAX_TENANTS for d in range(devices)}):
        yield
