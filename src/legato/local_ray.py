"""A Ray instance on this host's loopback for one ``with`` block: the one way legato starts
Ray (the cluster executor, ``legato serve --replicas``).

Ray's default session folder is the shared ``/tmp/ray``, which outlives the run and is
shared by every Ray on the host. Here each instance gets a temporary folder of its own,
removed once Ray has shut down, so nothing of a run stays behind and two runs (two test
sessions) never meet. The folder sits directly in ``/tmp`` whatever ``TMPDIR`` says:
Ray's Unix sockets live below it and a socket path must fit in 107 bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

_SHORT_TMP = "/tmp"


@contextmanager
def local_ray(num_cpus: int, resources: dict[str, float] | None = None) -> Iterator[None]:
    """Start Ray on loopback with ``num_cpus`` logical CPUs and custom ``resources``, quiet
    (no dashboard, no worker logs in this terminal); shut it down and delete its folder
    when the block ends."""
    import ray

    short = _SHORT_TMP if os.path.isdir(_SHORT_TMP) else None
    temp = tempfile.mkdtemp(prefix="legato-ray-", dir=short)
    try:
        ray.init(
            num_cpus=num_cpus,
            resources=resources,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
