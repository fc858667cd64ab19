"""A command run by ``legato.parallel.launch`` in test_parallel_launch.py.

``parent GRACE MODE OUT`` launches two ``worker MODE OUT`` processes and reports as
``legato``'s ``main`` does (a user error: one line, exit 2). A worker joins gloo, says it
is ready, then all-reduces until a SIGINT or SIGTERM; the ranks agree on stopping at a
step boundary (a sum of the stop flags), record the signal and exit 130. A worker's
ready file holds its pid. MODE ``error``
raises a user error on every rank instead; ``hang`` ignores the signals and, on rank 1,
never reaches the next collective (a stuck worker).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch

from legato.errors import ConfigError, LegatoError
from legato.parallel.launch import INTERRUPTED, launch, report_errors
from legato.parallel.process_group import process_group


def worker(mode: str, out: Path) -> int:
    got: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN if mode == "hang" else lambda n, _: got.append(n))
    with process_group("gloo", "cpu") as ctx:
        if mode == "error":
            raise ConfigError("train.steps: must be >= 1, got 0")
        (out / f"ready{ctx.rank}").write_text(str(os.getpid()))
        while True:
            if mode == "hang" and ctx.rank == 1:
                time.sleep(3600)
            stop = ctx.all_reduce_sum(torch.tensor([float(bool(got))]))
            if stop.item() > 0:
                break
            time.sleep(0.01)
        (out / f"stopped{ctx.rank}").write_text(signal.Signals(got[0]).name if got else "peer")
    return INTERRUPTED


def parent(grace_s: float, mode: str, out: str) -> int:
    try:
        return launch(2, [__file__, "worker", mode, out], grace_s=grace_s)
    except LegatoError as exc:
        print(f"legato: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    if sys.argv[1] == "parent":
        sys.exit(parent(float(sys.argv[2]), sys.argv[3], sys.argv[4]))
    sys.exit(report_errors(lambda: worker(sys.argv[2], Path(sys.argv[3]))))
