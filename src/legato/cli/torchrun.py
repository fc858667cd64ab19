"""The torchrun command of a job wider than one host, in one place.

``legato train`` starts processes on its own host only; a job over ``nodes`` hosts is
started by torchrun on each of them. ``legato train`` names this command when it is run
with too few processes, and ``legato plan --config OUT.toml`` writes it beside a multi-host
plan's config as ``OUT.torchrun.sh``, so both say the same thing.
"""

from __future__ import annotations

import shlex
from pathlib import Path

PORT = 29500
# what a user replaces (the message) or sets (the script): the first host's address
HOST_WORD = f"HOST:{PORT}"
HOST_VARIABLE = f'"${{HOST:?set HOST to the first host\'s address}}:{PORT}"'


def torchrun_command(
    nodes: int, nproc: int, train_args: list[str], endpoint: str = HOST_WORD
) -> str:
    """``torchrun ... -m legato.cli.main train ARGS`` as one shell line; ``endpoint`` is a
    shell word (quoted already) naming the rendezvous host and port."""
    launcher = shlex.join(
        ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(nproc),
         "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    )  # fmt: skip
    return f"{launcher} {endpoint} {shlex.join(['-m', 'legato.cli.main', 'train', *train_args])}"


def script_path(config_path: str | Path) -> Path:
    """``OUT.torchrun.sh`` beside ``OUT.toml``."""
    path = Path(config_path)
    return path.with_name(f"{path.stem}.torchrun.sh")


def torchrun_script(nodes: int, nproc: int, config_path: str | Path, header: str) -> str:
    """A POSIX shell script that starts this host's share of the job in ``config_path``:
    run it on every host with ``HOST`` set to the first host's address."""
    command = torchrun_command(nodes, nproc, [str(config_path)], HOST_VARIABLE)
    return (
        "#!/bin/sh\n"
        f"# {header}\n"
        f"# {nodes} hosts x {nproc} processes: on every host, with the config at the same path,\n"
        f"#   HOST=<first host's address> sh {shlex.quote(str(script_path(config_path)))}\n"
        "set -eu\n"
        f"exec {command}\n"
    )
