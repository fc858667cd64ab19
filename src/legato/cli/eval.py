"""``legato eval RUN_DIR [--data PATH] [--json]``: validation loss of a trained checkpoint
or of a Hugging Face model folder (with ``--data``; windows of at most 1,024 tokens).

On one process: the run's held-out split (``data.holdout``) by default, or the documents
of ``--data`` (txt/jsonl/parquet files, folders or globs, as ``data.paths``) tokenised with
the run's tokenizer, cut into windows of the run's sequence length.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="validation loss and perplexity of a trained checkpoint",
        description="Evaluate the latest (or the given) checkpoint of a run on its held-out "
        "split (data.holdout) or on --data.",
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory, a checkpoint or a Hugging Face folder"
    )
    parser.add_argument(
        "--data", action="append", metavar="PATH", help="evaluate on these files (repeatable)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    import contextlib

    import torch

    from legato.errors import ConfigError
    from legato.parallel.fp8 import compute_dtype
    from legato.train.evaluate import WholeModel, evaluate, trained_eval_set
    from legato.train.trained_model import load_trained

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {args.batch_size}")
    trained = load_trained(args.run_dir, "RUN_DIR")
    dataset = trained_eval_set(trained, args.data)
    low = compute_dtype(trained.config.train.dtype)  # the run's compute precision
    autocast = (lambda: torch.autocast("cpu", dtype=low)) if low else contextlib.nullcontext
    model = WholeModel(trained.model, autocast)
    result = evaluate(model, dataset, args.batch_size, device=torch.device("cpu"))
    report = {
        "checkpoint": str(trained.checkpoint),
        "step": trained.step,
        "data": args.data or "held-out split",
        **result.to_dict(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{trained.checkpoint} (step {trained.step}) on {len(dataset.tokens):,} tokens of "
            f"{', '.join(args.data) if args.data else 'the held-out split'}: loss "
            f"{result.loss:.4f}, perplexity {result.perplexity:.3f}, {result.tokens:,} label "
            f"tokens in {result.sequences:,} sequences"
        )
    return 0
