"""Fixtures shared by every test package: run directories, a small corpus; and the rules
of a session: a test that runs past its time limit has every process it started killed,
and a session that leaves processes, cgroups or files behind fails (``session_guard``).

Multi-process tests run their ranks through ``gloo_harness.run_ranks`` (this directory is on
``sys.path`` because this conftest lives here)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_timeout

from session_guard import SessionGuard, children, kill_descendants

HARD_STOP_AFTER_S = 60.0  # past its limit, a test whose main thread never returns to Python
EXIT_GRACE_S = 10.0  # how long a process a test started may take to exit after the test
_GUARD = pytest.StashKey[SessionGuard]()
_FAILED = pytest.StashKey[bool]()  # set on a test whose setup, call or teardown failed


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path_factory exists
def pytest_configure(config: pytest.Config) -> None:
    # pytest's own folders stay where they are, outside the session's TMPDIR
    basetemp = config._tmp_path_factory.getbasetemp()
    config.stash[_GUARD] = SessionGuard.start(caches=basetemp)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    guard = session.config.stash.get(_GUARD, None)
    if guard is None:
        return
    leaks = guard.leaks()
    guard.close()
    if leaks:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the session left these behind (removed now):", *leaks]
        for line in lines:
            (reporter.write_line if reporter else print)(f"LEAK: {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash[_FAILED] = True


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whatever a test started (a server, a launcher, gloo ranks) is gone after it: given
    ``EXIT_GRACE_S`` to exit, then killed, also after a failure; a passing test that left
    one is reported by the session. Processes started by wider fixtures (a module's Ray)
    were there before the test and stay."""
    me = os.getpid()
    before = set(children(me))
    yield
    deadline = time.monotonic() + EXIT_GRACE_S
    while (new := [p for p in children(me) if p not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if new:
        killed = kill_descendants(me, below=new)
        if not request.node.stash.get(_FAILED, False):
            guard = request.config.stash[_GUARD]
            guard.left_by_tests += [f"{p}, left by {request.node.nodeid}" for p in killed]


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> bool | None:
    """pytest-timeout's signal method, which fails the test but leaves what it started
    running, plus: the test's processes (gloo ranks, servers, Ray) are killed first. A
    main thread stuck in C code never runs a signal handler, so a watchdog thread kills
    them and ends the session ``HARD_STOP_AFTER_S`` later (pytest-timeout's thread method)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None

    def on_timeout(signum: int, frame: object) -> None:
        __tracebackhide__ = True
        killed = kill_descendants(os.getpid())
        pytest_timeout.dump_stacks(item.config.get_terminal_writer())
        pytest.fail(
            f"Timeout (>{settings.timeout:.0f}s); killed the processes it started: "
            f"{', '.join(killed) or 'none'}"
        )

    def hard_stop() -> None:
        kill_descendants(os.getpid())
        pytest_timeout.timeout_timer(item, settings)

    watchdog = threading.Timer(settings.timeout + HARD_STOP_AFTER_S, hard_stop)
    watchdog.daemon = True

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        watchdog.cancel()

    item.cancel_timeout = cancel  # what pytest-timeout's own cancel hook calls
    signal.signal(signal.SIGALRM, on_timeout)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    watchdog.start()
    return True


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh, not yet created, directory for one training run's outputs."""
    return tmp_path / "run"


@pytest.fixture(scope="session", autouse=True)
def calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Host calibrations of this session (``legato train`` measures the host once per
    process count) go to a session directory, never the user's cache."""
    from legato.train.prediction import CACHE_ENV

    path = tmp_path_factory.mktemp("calibrations")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if before is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session, so tokenised data is built once."""
    return tmp_path_factory.mktemp("legato-cache")


@pytest.fixture(scope="session")
def small_corpus(data_cache: Path) -> Path:
    """About 200 kB of the built-in corpus as a .txt file: enough for short training runs."""
    from legato.data import builtin_corpus_path

    return builtin_corpus_path(data_cache, seed=0, target_bytes=200_000)


# A model small enough that a training step takes milliseconds and a launch seconds.
SMALL_MODEL = (
    "{num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 1, "
    "ffn_hidden_size = 128, vocab_size = 258, seq_len = 64}"
)


@pytest.fixture(scope="session")
def small_train_args(data_cache: Path, small_corpus: Path):
    """``--section.key=value`` overrides for a seconds-long run of a small model.

    Call it with the run directory and any further overrides (later ones win).
    """

    def make(run_dir: Path, *extra: str) -> list[str]:
        return [
            f"--model.overrides={SMALL_MODEL}",
            f"--data.paths=['{small_corpus}']",
            f"--data.cache_dir={data_cache}",
            "--train.steps=6",
            "--train.global_batch_size=8",
            "--train.micro_batch_size=4",
            "--train.log_every=100",
            "--optim.warmup_steps=2",
            "--checkpoint.every=0",
            f"--run.dir={run_dir}",
            *extra,
        ]

    return make
