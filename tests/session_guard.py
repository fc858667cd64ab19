"""What a test session must leave as it found it, and the per-test time limit that kills
what a test started.

Checked for this session only (another copy of the suite may run beside it): processes
below this pytest process, cgroups whose per-run parent names this process as its owner
(``legato.cluster.cpu_share``), files left in the session's own ``TMPDIR``, new entries
in the checkout and in ``~/.cache/legato``.

The pytest process is made a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process whose
parent died (a worker of a killed launcher) is re-parented here rather than to init, so a
walk of this process's tree still finds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from legato.cluster.cpu_share import cgroups_owned_by, remove_cgroup_tree

_PR_SET_CHILD_SUBREAPER = 36
KEPT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
OWN_CACHES = ("__pycache__", ".pytest_cache")  # what Python and pytest write in the checkout
REPO = Path(__file__).resolve().parents[1]
USER_CACHE = Path.home() / ".cache" / "legato"


def become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of ``pid``, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0]


def exited(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    stat = _stat(pid)
    return stat is None or stat[1] == "Z"


def _tree() -> tuple[dict[int, list[int]], set[int]]:
    """Every process's children, and the zombies."""
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            if stat[1] == "Z":
                zombies.add(int(entry))
    return children, zombies


def _kept(pid: int) -> bool:
    """Helpers the interpreter keeps for its whole life (multiprocessing's resource
    tracker, started by the first spawned rank), not something a test left."""
    return any(k in describe(pid) for k in KEPT)


def children(root: int) -> list[int]:
    """Live (not zombie) children of ``root``."""
    tree, zombies = _tree()
    return [p for p in tree.get(root, []) if p not in zombies and not _kept(p)]


def descendants(root: int, below: list[int] | None = None) -> list[int]:
    """Live (not zombie) processes below ``root`` (or only below its children ``below``,
    themselves included), parents before children."""
    tree, zombies = _tree()
    top = tree.get(root, []) if below is None else below
    found, queue = [], [p for p in top if not _kept(p)]
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(tree.get(pid, []))
    return [p for p in found if p not in zombies]


def describe(pid: int) -> str:
    """``pid (its command line)``, shortened."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return str(pid)
    return f"{pid} ({command[:120].decode(errors='replace').strip()})"


def kill_descendants(root: int, below: list[int] | None = None) -> list[str]:
    """SIGKILL every process below ``root`` (or ``below`` its children ``below``),
    repeated until none is left (a dying parent may start one more); what was killed."""
    killed: list[str] = []
    for _ in range(20):
        pids = descendants(root, below)
        if not pids:
            break
        for pid in pids:
            killed.append(describe(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return killed


def _git_entries() -> set[str]:
    """The checkout's changed, untracked and ignored entries (ignored folders as one)."""
    if not (REPO / ".git").exists():
        return set()
    out = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return {line for line in out.stdout.splitlines() if not any(c in line for c in OWN_CACHES)}


def _cache_entries() -> set[str]:
    return {p.name for p in USER_CACHE.iterdir()} if USER_CACHE.is_dir() else set()


@dataclass
class SessionGuard:
    """The state a session started from; ``leaks()`` lists what it left behind."""

    tmpdir: Path
    left_by_tests: list[str] = field(default_factory=list)  # killed after a passing test
    git: set[str] = field(default_factory=_git_entries)
    cache: set[str] = field(default_factory=_cache_entries)

    @classmethod
    def start(cls, caches: Path) -> SessionGuard:
        """Become a subreaper and give the session (and every process it starts) a
        ``TMPDIR`` of its own; torch's compile cache goes to ``caches``."""
        become_subreaper()
        tmpdir = Path(tempfile.mkdtemp(prefix="legato-tests-"))
        os.environ["TMPDIR"] = str(tmpdir)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(caches / "torchinductor"))
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        return cls(tmpdir)

    def leaks(self, root: int | None = None) -> list[str]:
        """Each thing left behind by process ``root`` (this one) and what it started, as
        one line; the processes and cgroups are removed."""
        root = os.getpid() if root is None else root
        found = [f"process {p}" for p in [*self.left_by_tests, *kill_descendants(root)]]
        for parent in cgroups_owned_by(root):
            found.append(f"cgroup {parent}")
            remove_cgroup_tree(parent)
        found += [f"file {p}" for p in sorted(self.tmpdir.iterdir())]
        found += [f"checkout: {line}" for line in sorted(_git_entries() - self.git)]
        found += [f"{USER_CACHE}/{name}" for name in sorted(_cache_entries() - self.cache)]
        return found

    def close(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)
