"""The one way tests run code on several real gloo processes: spawn, rendezvous, teardown.

``run_ranks(worker, *args)`` starts ``world_size`` fresh processes (spawn), joins them in
one gloo group through a file store in a fresh directory (loopback only: no port to race
for), sets torchrun's variables (so ``Trainer`` and ``parallel.process_group.join`` reuse the group),
calls ``worker(rank, *args)`` on every rank and returns the ranks' return values, in rank
order, to the test. ``worker`` must be a module-level function; its arguments and return
value are pickled. Everything is bounded by ``timeout_s`` (the group's collectives and the
parent's wait alike).

Teardown, and why it ends in ``os._exit``: ``destroy_process_group`` unregisters the group
but does not stop gloo's threads (``pt_gloo_runloop``, ``gloo_tcp_loop``) while anything
still holds the group (a DeviceMesh, an FSDP2 module, a DTensor, a reference cycle the
collector has not reached). Those threads then live on into interpreter finalization, and
one that drops the last reference to a Python-owned tensor there must take the GIL: Python
ends such a thread with ``pthread_exit``, whose forced unwinding through a C++ destructor
(noexcept) calls ``std::terminate`` -- "terminate called without an active exception",
SIGABRT, after all the work is done. So each rank records its result, waits for every peer
(barrier), destroys the group, collects garbage (the group's destructor then joins its
threads) and leaves with ``os._exit(0)``, which never finalizes the interpreter.

Should a process still die after every rank recorded its result and closed its group, the
harness raises ``TeardownAbort`` (the only failure pytest reruns, see pyproject.toml); any
other failure, an assertion in a worker included, is reported as it is.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing import ProcessExitedException


class TeardownAbort(RuntimeError):
    """A rank's process died after every rank had recorded its result and closed its group."""


def run_ranks(
    worker: Callable[..., Any], *args: Any, world_size: int = 2, timeout_s: float = 120.0
) -> list[Any]:
    """``[worker(0, *args), ..., worker(world_size - 1, *args)]``, each in its own process."""
    with tempfile.TemporaryDirectory(prefix="legato-gloo-") as tmp:
        context = mp.start_processes(
            _rank_main,
            args=(worker, args, world_size, tmp, timeout_s),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s + 60  # + start-up: importing torch twice
        try:
            while not context.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{worker.__name__}: ranks still running after {timeout_s} s"
                    )
        except ProcessExitedException as exc:
            closed = [Path(tmp, f"rank{r}.closed").exists() for r in range(world_size)]
            if all(closed):
                raise TeardownAbort(f"{worker.__name__}: {exc} after every rank was done") from exc
            raise
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for error_file in context.error_files:  # torch leaves a crashed rank's behind
                Path(error_file).unlink(missing_ok=True)
        return [torch.load(Path(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def _rank_main(
    rank: int, worker: Callable, args: tuple, world: int, tmp: str, timeout_s: float
) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)  # the ranks share the host's cores
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world, timeout=timeout
    )
    try:
        result = worker(rank, *args)
        partial = Path(tmp, f"rank{rank}.pt.partial")
        torch.save(result, partial)
        partial.rename(Path(tmp, f"rank{rank}.pt"))
        del result
        # No rank tears gloo down while a peer still uses it. A barrier that fails means a
        # peer died after this rank's result was saved: that peer reports its own failure.
        with contextlib.suppress(RuntimeError):
            dist.barrier()
    finally:
        dist.destroy_process_group()
    gc.collect()  # what held the group goes: its destructor joins gloo's threads
    Path(tmp, f"rank{rank}.closed").touch()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # never finalize the interpreter under threads gloo may still run
