"""``legato train [CONFIG] [--section.key[=]value ...]``: train a model with torch.distributed.

Without torchrun in the environment and with ``parallel.nproc > 1``, the command launches
``nproc`` copies of itself on this host (``legato.parallel.launch``) and waits for them. A
user error in a worker is reported once, as one line, by this parent process instead of
one traceback per rank; Ctrl-C or SIGTERM lets the workers stop on their own (exit 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from legato.cli.torchrun import torchrun_command
from legato.errors import ConfigError
from legato.parallel.job import AUTO, parse_strategy
from legato.train.config import (
    TRAIN_FLAGS,
    TrainConfig,
    load_config,
    make_run_dir,
    render_toml,
    resolve_model,
    split_command_line,
)

PROFILE_STEPS = 3  # what `legato train --profile` profiles


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model (default: a tiny model on the built-in corpus, 2 CPU processes)",
        usage="legato train [-h] [--help-config] [--profile] [CONFIG] [--section.key[=]value ...]",
        description="Train a model. CONFIG is a TOML config file (see examples/). Every config "
        "field can be overridden with --section.key=value or --section.key value (a TOML "
        "literal, e.g. --train.steps 50 --data.paths=a.txt). --profile is "
        f"--train.profile_steps={PROFILE_STEPS}: that many steps after the first under "
        "torch.profiler, their traces and measured terms beside the prediction in "
        "<run>/profile/.",
    )
    parser.add_argument(
        "--help-config", action="store_true", help="list every config field with its default"
    )
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    if args.help_config:
        print(render_toml(header="legato train: every config field, with its default"), end="")
        return 0
    # CONFIG is not an argparse positional
    extra = [f"--train.profile_steps={PROFILE_STEPS}" if x == "--profile" else x for x in extra]
    config_path, extra = split_command_line(extra, TRAIN_FLAGS)
    config = load_config(config_path, extra)
    if "LOCAL_RANK" in os.environ:  # a worker of torchrun or of our own launch
        return _run_worker(config)
    return _run_here_or_launch(config, config_path, extra)


def _run_worker(config: TrainConfig) -> int:
    """0 when done; 130 (``EXIT_INTERRUPTED``) after a clean stop on SIGINT/SIGTERM, in
    the loop (checkpointed) or during set-up (rank 0 printed one line); 2 a user error."""
    from legato.parallel.launch import report_errors
    from legato.train.interrupt import EXIT_INTERRUPTED, Interrupted
    from legato.train.trainer import Trainer

    def fit() -> int:
        try:
            result = Trainer(config).fit()
        except Interrupted as exc:
            if os.environ.get("RANK", "0") == "0":
                print(f"legato: {exc}", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        return EXIT_INTERRUPTED if result.interrupted else 0

    return report_errors(fit)


def _run_here_or_launch(config: TrainConfig, config_path: str | None, extra: list[str]) -> int:
    from legato.parallel.process_group import resolve_device
    from legato.train.run_dir import owned

    nproc = config.parallel.nproc
    _refuse_other_hosts(config, config_path, extra)
    spec = resolve_model(config.model)  # fail on a bad model or layout before any process
    device = resolve_device(config.train.device)
    if config.parallel.strategy != AUTO:  # a strategy that cannot run fails before anything
        config.job(spec, nproc)
    if not config.parallel.cluster and device.type == "cpu":  # calibrations start processes
        from legato.train.prediction import ensure_host_calibration

        ensure_host_calibration(nproc)
    if config.parallel.strategy == AUTO:  # chosen once, here; the workers get the string
        from legato.train.auto_strategy import resolve_auto

        config = resolve_auto(config, spec, nproc, device.type)
        extra = [*extra, f"--parallel.strategy={config.parallel.strategy}"]
        config.job(spec, nproc)
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
        with owned(run_dir):  # for the whole run; the workers learn that it is held
            if nproc == 1:
                from legato.train.interrupt import EXIT_INTERRUPTED
                from legato.train.trainer import Trainer

                run = dataclasses.replace(config.run, dir=str(run_dir))
                result = Trainer(dataclasses.replace(config, run=run)).fit()
                code = EXIT_INTERRUPTED if result.interrupted else 0
            else:
                from legato.parallel.launch import launch

                argv = ["-m", "legato.cli.main", "train"]
                argv += [config_path] if config_path else []
                code = launch(nproc, [*argv, *extra, f"--run.dir={run_dir}"])
    finally:
        if code != 0 and not any(run_dir.iterdir()):
            run_dir.rmdir()  # a run that failed before writing anything leaves no trace
    print(f"run directory: {run_dir}", flush=True)
    return code


def _refuse_other_hosts(config: TrainConfig, config_path: str | None, extra: list[str]) -> None:
    """A job wider than this host's ``parallel.nproc`` processes (``parallel.nodes`` > 1,
    or a strategy over more ranks) is started by torchrun on every host: one line that
    gives the command. A width that is no multiple of nproc is left to the strategy's check."""
    parallel = config.parallel
    needed = parallel.nodes * parallel.nproc
    if parallel.strategy != AUTO:
        needed = max(needed, parse_strategy(parallel.strategy).world_size)
    if needed <= parallel.nproc or needed % parallel.nproc:
        return
    nodes = needed // parallel.nproc
    command = torchrun_command(
        nodes, parallel.nproc, [*([config_path] if config_path else []), *extra]
    )
    field = "parallel.nodes" if parallel.nodes == nodes else "parallel.strategy"
    raise ConfigError(
        f"{field}: the job runs on {needed} processes ({nodes} hosts x {parallel.nproc}) and "
        "`legato train` starts them on this host only; run on every host, with HOST the "
        f"first host's address: {command}"
    )
