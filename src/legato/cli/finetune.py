"""``legato finetune CONFIG [--section.key[=]value ...]``: train many LoRA adapters at once.

All tasks of the config share one frozen base model; their tokens are fused into each
forward and backward (see docs/lora.md). Each task's adapter is saved in PEFT's format
under ``run.output_dir/<task name>/`` when the task finishes. With ``run.nproc`` > 1 (and
no torchrun around it) the command launches that many data-parallel copies of itself on
this host (``legato.parallel.launch``).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from legato.lora.config import FinetuneConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune several LoRA adapters at once on one frozen base model",
        usage="legato finetune [-h] CONFIG [--section.key[=]value ...]",
        description="Fine-tune the [[tasks]] of CONFIG, a TOML config file (see "
        "examples/finetune.toml), together (fused multi-task LoRA). Fields of [base], [run], "
        "[schedule] and [task_defaults] can be overridden with --section.key=value or "
        "--section.key value, e.g. --task_defaults.steps 20 --run.device=cpu.",
    )
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from legato.errors import ConfigError
    from legato.lora.config import load_finetune_config
    from legato.parallel.launch import launch, report_errors
    from legato.train.config import split_command_line

    config_path, overrides = split_command_line(extra)  # CONFIG is not an argparse positional
    if config_path is None:
        raise ConfigError("CONFIG: give a TOML config file (see examples/finetune.toml)")
    config = load_finetune_config(config_path, overrides)
    if config.run.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return launch(config.run.nproc, ["-m", "legato.cli.main", "finetune", *extra])
    return report_errors(lambda: _finetune(config))


def _finetune(config: FinetuneConfig) -> int:
    from legato.lora.runner import finetune

    saved = finetune(config)
    for name, path in saved.items():
        print(f"{name}: {path}")
    return 0
