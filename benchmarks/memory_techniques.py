"""Device-memory techniques on CPU: activation swap, chunked loss, variable-length packing.

One JSON line per measurement (``ratio = value / baseline_value``):

* ``swap``: bytes of saved activations resident on the compute device at the peak of a
  training step (the ``SavedBytes`` ledger; on CPU host and device are one memory, so
  this is what a GPU would hold), with ``ActivationSwap`` on every block vs without, and
  with reentrant checkpointing per block, with and without swapping the checkpointed
  inputs (lower is better); tokens/s of a forward+backward with swap vs without (median
  of ``--repeats``; on CPU the copies are plain memcpy, so this is the copy cost alone).
  Losses and gradients must be bitwise equal: ``extra.max_grad_diff``.
* ``chunked_loss``: peak resident memory added by one training step (``VmHWM`` minus
  ``VmRSS`` before the step, each in a fresh process) of a model with a 131,072-token
  vocabulary, chunked vs unchunked LM head + cross-entropy (lower is better), and tokens/s;
  ``extra`` has the largest loss and gradient differences.
* ``predicted_memory_gib`` (``legato.cost.xtuner_terms``): memory per device of a
  200B-class MoE at 64K tokens on H800s, FSDP only, with the techniques vs without; and
  ``fp8_step_speedup_bound``, the Amdahl bound of FP8 block linears vs XTuner's 1.225x.
* ``varlen``: padding fraction of the built-in corpus (byte tokenizer) packed per document
  vs every document padded to the longest (lower is better), and the largest rank's
  tokens over the mean for 8 data-parallel ranks, token-balanced vs contiguous split.

    python benchmarks/memory_techniques.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from legato.cost.xtuner_terms import (
    XTunerOptions,
    fp8_linear_speedup,
    swap_overhead,
    xtuner_memory,
)
from legato.data import ByteTokenizer, builtin_corpus_path, prepare_tokens
from legato.data.varlen import VarlenDataset, balance_by_tokens, padding_fraction
from legato.memory import ActivationSwap, SavedBytes, chunked_lm_loss, count_saved_tensors
from legato.models import build_model
from legato.specs import load_device, load_model
from legato.specs.strategy import Strategy
from report import print_row, result_row

VOCAB_128K = 131072


def _row(case: dict, metric: str, value: float, baseline: str, base: float, **extra) -> dict:
    """A result row; this benchmark keeps its additional figures under ``extra``."""
    nested = {"extra": extra} if extra else {}
    return result_row("memory_techniques", case, metric, value, baseline, base, **nested)


def _step(model, ids, labels, setup=None):
    stats = SavedBytes()
    if setup is not None:
        setup(model, stats)
    with count_saved_tensors(stats):
        loss = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], stats


def _tokens_per_s(fn, tokens: int, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return tokens / statistics.median(times[1:])


def _checkpoint_blocks(model, stats=None) -> None:
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=True)


def _swap(model, stats) -> None:
    ActivationSwap(model.blocks, stats=stats, min_bytes=0)


def _checkpoint_and_swap(model, stats) -> None:
    _checkpoint_blocks(model)
    _swap(model, stats)


def swap_rows(quick: bool, repeats: int) -> list[dict]:
    layers, seq, batch = (4, 256, 2) if quick else (8, 512, 4)
    spec = load_model("tiny").with_(num_layers=layers, vocab_size=258, seq_len=seq)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 258, (batch, seq), generator=g)
    labels = ids.roll(-1, 1)
    case = {"preset": "tiny", "layers": layers, "tokens": batch * seq}
    runs = {
        name: _step(build_model(spec, seed=0), ids, labels, setup)
        for name, setup in (
            ("plain", None),
            ("swap", _swap),
            ("checkpoint", _checkpoint_blocks),
            ("checkpoint_swap", _checkpoint_and_swap),
        )
    }

    def diff(a: str, b: str) -> float:
        grads = zip(runs[a][1], runs[b][1], strict=True)
        return max(float((x - y).abs().max()) for x, y in grads)

    rows = [
        _row(
            case,
            "peak_saved_device_bytes",
            runs["swap"][2].peak_device,
            "no_swap",
            runs["plain"][2].peak_device,
            loss_diff=float(runs["swap"][0] - runs["plain"][0]),
            max_grad_diff=diff("swap", "plain"),
            host_bytes=runs["swap"][2].peak_host,
            copied_each_way=runs["swap"][2].to_host,
        ),
        _row(
            case | {"checkpoint": "reentrant, every block"},
            "peak_saved_device_bytes",
            runs["checkpoint_swap"][2].peak_device,
            "checkpoint_only",
            runs["checkpoint"][2].peak_device,
            max_grad_diff=diff("checkpoint_swap", "checkpoint"),
        ),
    ]
    speed = {}
    for name, setup in (("plain", None), ("swap", _swap)):
        model = build_model(spec, seed=0)
        if setup is not None:
            setup(model, SavedBytes())

        def once(model=model) -> None:
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(ids).flatten(0, 1), labels.flatten()).backward()

        speed[name] = _tokens_per_s(once, batch * seq, repeats)
    rows.append(_row(case, "tokens_per_s", speed["swap"], "no_swap", speed["plain"]))
    return rows


def _vmem(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _chunk_setup(quick: bool):
    tokens = (1, 1024) if quick else (2, 1024)
    spec = load_model("tiny").with_(num_layers=2, vocab_size=VOCAB_128K, seq_len=tokens[1])
    ids = torch.randint(0, VOCAB_128K, tokens, generator=torch.Generator().manual_seed(0))
    return spec, ids, ids.roll(-1, 1)


def _loss(model, ids, labels, chunk: int) -> torch.Tensor:
    if chunk:
        return chunked_lm_loss(model, ids, labels, chunk_size=chunk)
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())


def chunk_child(chunk: int, quick: bool) -> None:
    """In a fresh process: the memory one training step adds, printed as JSON."""
    spec, ids, labels = _chunk_setup(quick)
    model = build_model(spec, seed=0)
    before = _vmem("VmRSS")
    _loss(model, ids, labels, chunk).backward()
    print(json.dumps({"peak_added_bytes": _vmem("VmHWM") - before}))


def _child_peak(chunk: int, quick: bool) -> int:
    cmd = [sys.executable, __file__, "--chunk-child", str(chunk)] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_added_bytes"]


def chunked_loss_rows(quick: bool, repeats: int, chunk: int) -> list[dict]:
    spec, ids, labels = _chunk_setup(quick)
    results = {}
    for c in (0, chunk):
        model = build_model(spec, seed=0)
        loss = _loss(model, ids, labels, c)
        loss.backward()
        results[c] = (loss.detach(), [p.grad for p in model.parameters()])

        def once(model=model, c=c) -> None:
            model.zero_grad(set_to_none=True)
            _loss(model, ids, labels, c).backward()

        results[c] += (_tokens_per_s(once, ids.numel(), repeats),)
    grads = zip(results[chunk][1], results[0][1], strict=True)
    rel = max(float((a - b).norm() / b.norm().clamp(min=1e-30)) for a, b in grads)
    case = {"vocab": VOCAB_128K, "hidden": spec.hidden_size, "tokens": ids.numel(), "chunk": chunk}
    peaks = {c: _child_peak(c, quick) for c in (0, chunk)}
    return [
        _row(
            case,
            "step_peak_added_bytes",
            peaks[chunk],
            "unchunked",
            peaks[0],
            loss_diff=float(results[chunk][0] - results[0][0]),
            max_grad_rel_diff=rel,
            logits_fp32_bytes=4 * ids.numel() * VOCAB_128K,
        ),
        _row(case, "tokens_per_s", results[chunk][2], "unchunked", results[0][2]),
    ]


def varlen_rows(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as cache:
        path = builtin_corpus_path(cache, seed=0, target_bytes=300_000 if quick else 3_000_000)
        tokens = prepare_tokens(path, ByteTokenizer())
    rows = []
    for seq_len in (256, 512, 1024, 2048):
        data = VarlenDataset(tokens, seq_len, eos_id=256, pad_id=257, seed=0)
        pad = data.padding()
        case = {"corpus": "builtin", "tokenizer": "byte", "seq_len": seq_len}
        rows.append(
            _row(
                case,
                "padding_fraction",
                pad["packed"],
                "pad_each_document_to_longest",
                pad["padded_to_longest"],
                sequences=data.num_sequences,
                documents=len(data.pieces),
            )
        )
    rng = np.random.default_rng(0)
    docs = rng.choice(data.slots, size=64, replace=False).tolist()  # one doc per sequence
    balanced = [sum(docs[i] for i in r) for r in balance_by_tokens(docs, 8)]
    contiguous = [sum(docs[r * 8 : (r + 1) * 8]) for r in range(8)]
    case = {"world": 8, "global_batch": 64, "sequences": "unpacked documents"}
    mean = sum(docs) / 8
    rows.append(
        _row(
            case,
            "max_rank_tokens_over_mean",
            max(balanced) / mean,
            "contiguous_split",
            max(contiguous) / mean,
            padding_unpacked=padding_fraction(docs, 64, max(docs)),
        )
    )
    return rows


def predicted_rows() -> list[dict]:
    """The cost model's memory per device for XTuner's 200B-class case: Qwen3-235B-A22B
    at 64K tokens per sequence, FSDP only over 256 H800s, one sequence per device."""
    model = load_model("qwen3-235b-a22b").with_(seq_len=65536)
    h800 = load_device("h800")
    rows = []
    for recompute in ("none", "full"):
        strategy = Strategy(dp=256, zero=3, mbs=1, gbs=256, recompute=recompute)
        base = xtuner_memory(model, strategy)
        for options in (
            XTunerOptions(swap=True),
            XTunerOptions(loss_chunk=4096),
            XTunerOptions(swap=True, loss_chunk=4096),
            XTunerOptions(swap=True, loss_chunk=4096, fp8=True),
        ):
            mem = xtuner_memory(model, strategy, options)
            case = {"model": model.name, "seq": 65536, "dp": 256, "device": "h800"}
            case |= {"recompute": recompute, "swap": options.swap}
            case |= {"loss_chunk": options.loss_chunk, "fp8": options.fp8}
            traffic = swap_overhead(model, strategy, h800, options) if options.swap else None
            rows.append(
                _row(
                    case,
                    "predicted_memory_gib",
                    mem.total / 2**30,
                    "fsdp_only",
                    base.total / 2**30,
                    fits_80gib=mem.total / 2**30 <= h800.memory_gib,
                    baseline_fits=base.total / 2**30 <= h800.memory_gib,
                    terms_gib={k: round(v, 2) for k, v in mem.gib().items()},
                    swap_gb_each_way=traffic and traffic.bytes_each_way / 1e9,
                    swap_exposed_s=traffic and traffic.exposed_s,
                )
            )
    speedup = fp8_linear_speedup(model, h800, 65536)
    case = {"model": model.name, "seq": 65536, "device": "h800"}
    rows.append(_row(case, "fp8_step_speedup_bound", speedup, "xtuner_reported", 2450 / 2000))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller cases, under a minute")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per case (median)")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per loss chunk")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable medians)")
    parser.add_argument("--chunk-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.chunk_child is not None:
        chunk_child(args.chunk_child, args.quick)
        return
    repeats = 3 if args.quick else args.repeats
    rows = predicted_rows()
    rows += swap_rows(args.quick, repeats)
    rows += chunked_loss_rows(args.quick, repeats, args.chunk)
    rows += varlen_rows(args.quick)
    for row in rows:
        print_row(row)


if __name__ == "__main__":
    main()
