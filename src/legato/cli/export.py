"""``legato export RUN_DIR --format hf OUT``: a trained checkpoint as a Hugging Face folder.

RUN_DIR is a run directory (its latest checkpoint), its ``checkpoints/`` folder or one
``checkpoints/step_N``. OUT then loads with ``transformers``' ``from_pretrained``.
"""

from __future__ import annotations

import argparse

FORMATS = ("hf",)  # here, not in train.export: building the parser must not import torch


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a trained checkpoint as a Hugging Face model folder",
        description="Export the latest (or the given) checkpoint of a run: config.json, "
        "model.safetensors, generation_config.json and the run's tokenizer, for "
        "AutoModelForCausalLM / AutoTokenizer.from_pretrained(OUT).",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a checkpoint")
    parser.add_argument("out", metavar="OUT", help="the folder to write (replaced if present)")
    parser.add_argument("--format", choices=FORMATS, default="hf", help="output format")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from legato.train.export import export_trained
    from legato.train.trained_model import load_trained

    trained = load_trained(args.run_dir, "RUN_DIR")
    out = export_trained(trained, args.out)
    print(f"exported {trained.checkpoint} (step {trained.step}, {trained.spec.name}) to {out}")
    return 0
