"""``legato train [CONFIG] [--section.key[=]value ...]``: train a model with torch.distributed.

Without torchrun in the environment and with ``parallel.nproc > 1``, the command launches
``nproc`` copies of itself on this host through torch's elastic launcher (what torchrun
runs) and waits for them. A user error in a worker is reported once, as one line, by this
parent process instead of one traceback per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from legato.errors import ConfigError, LegatoError
from legato.train.config import (
    TrainConfig,
    load_config,
    make_run_dir,
    render_toml,
    resolve_model,
    split_command_line,
)
from legato.train.strategy import pipeline_schedule, resolve_strategy

_ERROR_DIR_ENV = "LEGATO_TRAIN_ERROR_DIR"  # where launched workers leave their one-line errors


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model (default: a tiny model on the built-in corpus, 2 CPU processes)",
        usage="legato train [-h] [--help-config] [CONFIG] [--section.key[=]value ...]",
        description="Train a model. CONFIG is a TOML config file (see examples/). Every config "
        "field can be overridden with --section.key=value or --section.key value (a TOML "
        "literal, e.g. --train.steps 50 --data.paths=a.txt).",
    )
    parser.add_argument(
        "--help-config", action="store_true", help="list every config field with its default"
    )
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.help_config:
        print(render_toml(header="legato train: every config field, with its default"), end="")
        return 0
    config_path, extra = split_command_line(extra)  # CONFIG is not an argparse positional
    config = load_config(config_path, extra)
    if "LOCAL_RANK" in os.environ:  # a worker of torchrun or of our own launch
        return _run_worker(config)
    return _run_here_or_launch(config, config_path, extra)


def _run_worker(config: TrainConfig) -> int:
    from legato.train.trainer import Trainer

    error_dir = os.environ.get(_ERROR_DIR_ENV)
    try:
        Trainer(config).fit()
    except LegatoError as exc:
        if not error_dir:
            raise
        rank = os.environ.get("RANK", "0")
        Path(error_dir, f"rank{rank}.txt").write_text(str(exc), encoding="utf-8")
        return 2
    return 0


def _run_here_or_launch(config: TrainConfig, config_path: str | None, extra: list[str]) -> int:
    from legato.train.distributed import resolve_device

    nproc = config.parallel.nproc
    spec = resolve_model(config.model)  # fail on a bad model or layout before any process
    strategy = resolve_strategy(config, spec, nproc)
    if strategy.pp > 1:
        pipeline_schedule(strategy)
    device = resolve_device(config.train.device)
    if device.type == "cuda":
        import torch

        if nproc > torch.cuda.device_count():
            raise ConfigError(
                f"parallel.nproc: {nproc} processes but only {torch.cuda.device_count()} GPUs"
            )
    if config.data.paths:  # a missing file fails here, before any directory or process
        from legato.data import resolve_paths

        resolve_paths(config.data.paths)
    run_dir = make_run_dir(config.run)
    print(f"run directory: {run_dir}", flush=True)
    code = 1
    try:
        if nproc == 1:
            from legato.train.trainer import Trainer

            run = dataclasses.replace(config.run, dir=str(run_dir))
            Trainer(dataclasses.replace(config, run=run)).fit()
            code = 0
        else:
            argv = ["-m", "legato.cli.main", "train"]
            argv += [config_path] if config_path else []
            code = _launch(nproc, [*argv, *extra, f"--run.dir={run_dir}"])
    finally:
        if code != 0 and not any(run_dir.iterdir()):
            run_dir.rmdir()  # a run that failed before writing anything leaves no trace
    print(f"run directory: {run_dir}", flush=True)
    return code


def _launch(nproc: int, argv: list[str]) -> int:
    """Run ``python argv`` in ``nproc`` processes (torchrun --standalone); their exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"legato-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    with tempfile.TemporaryDirectory(prefix="legato-errors-") as errors, _launch_env(errors):
        try:
            elastic_launch(launch, sys.executable)(*argv)
        except ChildFailedError as exc:
            messages = [
                path.read_text(encoding="utf-8") for path in sorted(Path(errors).glob("rank*.txt"))
            ]
            if messages:
                raise _WorkerError(messages) from None
            _, failure = exc.get_first_failure()
            print(
                f"legato: error: a training process failed (exit code {failure.exitcode})",
                file=sys.stderr,
            )
            return failure.exitcode if failure.exitcode > 0 else 1
    return 0


class _WorkerError(LegatoError):
    """The distinct one-line errors of the workers, shown once each."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(dict.fromkeys(messages)))


@contextlib.contextmanager
def _launch_env(error_dir: str) -> Iterator[None]:
    """Tell workers where to put errors; keep the launcher's own logging quiet."""
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.distributed.run")]
    levels = [lg.level for lg in loggers]
    old = os.environ.get(_ERROR_DIR_ENV)
    os.environ[_ERROR_DIR_ENV] = error_dir
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if old is None:
            os.environ.pop(_ERROR_DIR_ENV, None)
        else:
            os.environ[_ERROR_DIR_ENV] = old
