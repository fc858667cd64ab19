"""The ``legato`` command: one sub-command group per module, registered here.

Each ``legato.cli.<group>`` module exposes ``register(subparsers)`` which adds its
sub-commands and sets ``func`` on the parsed namespace. User errors (``LegatoError``) are
printed as one line on stderr with exit code 2; nothing else is caught.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from legato.errors import LegatoError

# Modules under legato.cli that register sub-commands, in help order.
COMMAND_GROUPS = (
    "presets",
    "plan",
    "calibrate",
    "train",
    "eval",
    "export",
    "schedule",
    "finetune",
    "cluster",
    "serve",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="legato",
        description="Plan, train and adapt large language models with torch.distributed.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for group in COMMAND_GROUPS:
        importlib.import_module(f"legato.cli.{group}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args, extra) or 0)
    except LegatoError as exc:
        print(f"legato: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("legato: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    code = main()
    if "LOCAL_RANK" in os.environ:  # a launched worker: see exit_worker for why
        from legato.parallel.process_group import exit_worker

        exit_worker(code)
    sys.exit(code)
