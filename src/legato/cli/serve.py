"""``legato serve`` (an OpenAI-compatible server) and ``legato generate`` (one answer).

Both load the same way (``serve/loading.py``): ``--model`` a legato run directory, or a
preset or ModelSpec TOML (random weights, or ``--weights`` HF safetensors); ``--adapters`` PEFT folders or
folders of them. Only the bare demo — a preset on random weights and no ``--adapters`` —
gets four random adapters (``lora-0`` ...), so it runs on a fresh machine; real weights
(a run directory or ``--weights``) are served with exactly the adapters given (random ones
would be noise listed beside a real model), and ``--adapters`` with no folder means none.
``serve --replicas N`` runs N engines behind Ray Serve on this host, routed by adapter and
load. The port is bound before the model loads, so a busy one fails at once. The guard
(``serve/access.py``: ``--api-key``, ``--max-request-bytes``, ``--enable-lora-updating``,
``--lora-root``) is the same for one engine and for replicas. Flag names follow vLLM's
where it has one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from legato.errors import ConfigError
from legato.serve.policies import DEFAULT_LINK_GBPS, POLICIES

API_KEY_ENV = "LEGATO_API_KEY"  # as VLLM_API_KEY: a key kept out of the process list


def _model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="tiny", help="a legato run directory, a preset or a ModelSpec TOML"
    )
    parser.add_argument("--weights", help="HF-named safetensors for a preset")
    parser.add_argument("--tokenizer", help="'byte' (default) or a tokenizer.json")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument(
        "--num-blocks", type=int, default=512, help="device blocks, shared by KV and adapters"
    )
    parser.add_argument(
        "--policy", default="elora", choices=POLICIES, help="device memory policy (elora)"
    )
    parser.add_argument("--max-loras", type=int, default=4, help="vllm policy: adapter slots")
    parser.add_argument(
        "--max-lora-rank", type=int, default=0,
        help="vllm policy: each slot holds at least this rank on every layer (0: largest given)",
    )  # fmt: skip
    parser.add_argument(
        "--link-gbps", type=float, default=DEFAULT_LINK_GBPS,
        help=f"host-to-device adapter copies (default {DEFAULT_LINK_GBPS}, docs/serving.md)",
    )  # fmt: skip
    parser.add_argument(
        "--device-memory", default=None, metavar="SIZE",
        help="bytes of the device pool (e.g. 64MiB, 2GB); sets --num-blocks from the model",
    )  # fmt: skip
    parser.add_argument(
        "--swap-space", type=float, default=0.0, metavar="GIB",
        help="host memory (GiB) for KV blocks the device evicts, copied back on reuse (0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--max-cpu-loras", type=int, default=0,
        help="adapters kept in host memory, least recently used read again from disk (0: all)",
    )  # fmt: skip
    parser.add_argument("--max-num-seqs", type=int, default=16, help="requests per batch")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="tokens per engine step"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="serve a model and LoRA adapters over HTTP")
    _model_flags(serve)
    serve.add_argument(
        "--adapters", nargs="*", default=None,
        help="PEFT adapter folders (default: four random ones on a random-weight preset, "
        "none on real weights; the flag alone: none)",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    serve.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    serve.add_argument(
        "--decision-log", default=None, metavar="FILE",
        help="write each engine step's decisions as JSON lines (serve simulate replays them)",
    )  # fmt: skip
    serve.add_argument(
        "--request-log", default=None, metavar="FILE",
        help="write each finished request (arrival, adapter, lengths) as JSON lines",
    )  # fmt: skip
    serve.add_argument(
        "--replicas", type=int, default=1,
        help="engines behind Ray Serve, routed by adapter and load (1: one engine, no Ray)",
    )  # fmt: skip
    serve.add_argument(
        "--adapters-per-replica", type=int, default=8,
        help="with --replicas: adapters a replica holds before its least recently used leaves",
    )  # fmt: skip
    serve.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every /v1 route (default: ${API_KEY_ENV})",
    )  # fmt: skip
    serve.add_argument(
        "--max-request-bytes", default=None, metavar="SIZE",
        help="largest request body, e.g. 4MiB (default); larger ones are refused with 413",
    )  # fmt: skip
    serve.add_argument(
        "--enable-lora-updating", action="store_true",
        help="allow /v1/load_lora_adapter and /v1/unload_lora_adapter (needs --lora-root)",
    )  # fmt: skip
    serve.add_argument(
        "--lora-root", action="append", default=[], metavar="DIR",
        help="with --enable-lora-updating: a folder runtime loads may read under (repeatable)",
    )  # fmt: skip
    serve.set_defaults(func=_serve)
    from legato.cli import serve_simulate

    serve_simulate.register(serve.add_subparsers(dest="serve_command", metavar="{simulate}"))
    generate = subparsers.add_parser("generate", help="one completion from a model or adapter")
    _model_flags(generate)
    generate.add_argument("prompt", help="the prompt text")
    generate.add_argument("--adapter", help="a PEFT adapter folder to answer with")
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--top-k", type=int, default=0)
    generate.add_argument("--seed", type=int)
    generate.add_argument("--stop", action="append", default=[], help="a stop string")
    generate.set_defaults(func=_generate)


# The least each integer flag takes; a flag the command lacks is skipped.
_AT_LEAST = {
    "block_size": 1, "num_blocks": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1,
    "max_loras": 1, "max_lora_rank": 0, "max_cpu_loras": 0, "max_queue": 1, "replicas": 1,
    "adapters_per_replica": 1,
}  # fmt: skip


def _engine_config(args: argparse.Namespace):
    """The engine's config from the flags, every flag of the command checked (so a bad one
    is refused before a port is bound or a model loads)."""
    from legato.serve.engine import EngineConfig

    for name, least in _AT_LEAST.items():
        value = getattr(args, name, least)
        if value < least:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= {least}, got {value}")
    if not args.link_gbps > 0:
        raise ConfigError(f"--link-gbps: must be > 0, got {args.link_gbps}")
    device_memory = (
        0 if args.device_memory is None else _bytes(args.device_memory, "--device-memory")
    )
    if not args.swap_space >= 0:
        raise ConfigError(f"--swap-space: must be >= 0 GiB, got {args.swap_space}")
    return EngineConfig(
        block_size=args.block_size, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_queue=getattr(args, "max_queue", 256), policy=args.policy, max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank, link_gbps=args.link_gbps, device_memory=device_memory,
        swap_space=int(args.swap_space * 2**30), max_cpu_loras=args.max_cpu_loras,
    )  # fmt: skip


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def _bytes(text: str, flag: str) -> int:
    """A size flag: bytes, or a number with a unit (KB/MB/GB: powers of 1000, KiB/MiB/GiB:
    powers of 1024)."""
    number = text.strip().rstrip("bBiIkKmMgGtT")
    unit = text.strip()[len(number) :].upper()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ConfigError(
            f"{flag}: expected bytes or a size such as 64MiB or 2GB, got {text!r}"
        ) from None
    if value < 1:
        raise ConfigError(f"{flag}: must be at least 1 byte, got {text!r}")
    return int(value)


def resolve_api_key(args: argparse.Namespace) -> str | None:
    """``--api-key``, else ``$LEGATO_API_KEY`` (empty counts as unset): of ``serve`` and of
    ``bench serve``, the client that must send it."""
    return args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None


def _access(args: argparse.Namespace):
    """The guard of ``serve`` (one engine or replicas) from its flags."""
    from legato.serve.access import DEFAULT_MAX_REQUEST_BYTES, Access

    key = resolve_api_key(args)
    size = args.max_request_bytes
    limit = DEFAULT_MAX_REQUEST_BYTES if size is None else _bytes(size, "--max-request-bytes")
    roots = tuple(Path(root) for root in args.lora_root)
    return Access(key, limit, args.enable_lora_updating, roots)


def _engine(args: argparse.Namespace, config, adapters, folders: dict | None = None):
    """The engine of ``config`` for ``args`` serving ``adapters(model)``, read from
    ``folders``."""
    from legato.serve.clock import WallClock
    from legato.serve.decisions import DecisionLog
    from legato.serve.engine import Engine
    from legato.serve.loading import load_served_model
    from legato.serve.request_log import RequestLog

    model, tokenizer, name = load_served_model(args.model, args.weights, args.tokenizer)
    clock = WallClock()
    decisions, requests = getattr(args, "decision_log", None), getattr(args, "request_log", None)
    return Engine(model, tokenizer, adapters(model), config, model_name=name, sources=folders,
                  clock=clock, decision_log=DecisionLog(decisions) if decisions else None,
                  request_log=RequestLog(requests, clock.now()) if requests else None)  # fmt: skip


def _serve(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.serve.server import listen

    config = _engine_config(args)
    access = _access(args)
    sock = listen(args.host, args.port)  # a busy port fails here, before anything loads
    if args.replicas != 1:
        sock.close()  # Ray Serve's proxy binds it; this only checked that it is free
        return _serve_replicas(args, config, access)
    import uvicorn

    from legato.serve.server import create_app

    with sock:
        engine, roots = _served_engine(args, config)
        names = ", ".join(engine.adapters) or "none"
        port = sock.getsockname()[1]
        print(f"serving {engine.model_name} with adapters {names} on http://{args.host}:{port}/v1",
              file=sys.stderr)  # fmt: skip
        config = uvicorn.Config(create_app(engine, roots, access), log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def _demo_adapters(args: argparse.Namespace) -> bool:
    """Whether ``serve`` makes random adapters: only for the bare demo (no ``--adapters``
    flag, random weights), see the module docstring."""
    from legato.serve.loading import random_weights

    return args.adapters is None and random_weights(args.model, args.weights)


def _served_engine(args: argparse.Namespace, config):
    """The engine of ``serve`` and each adapter's folder (what /v1/models lists)."""
    from legato.lora.peft_io import load_adapter
    from legato.serve.loading import adapter_folders, generated_adapters

    folders = adapter_folders(args.adapters) if args.adapters else {}
    demo = _demo_adapters(args)

    def adapters(model):
        if demo:
            return generated_adapters(model)
        return {name: load_adapter(f, model).eval() for name, f in folders.items()}

    engine = _engine(args, config, adapters, folders)
    return engine, {n: str(folders.get(n, n)) for n in engine.adapters}


def _serve_replicas(args: argparse.Namespace, config, access) -> int:
    """``--replicas N``: N engines behind Ray Serve on this host (serve/replicas.py)."""
    import shutil
    import tempfile
    import threading

    from legato.lora.peft_io import save_adapter
    from legato.serve.loading import generated_adapters, load_served_model
    from legato.serve.replicas import ReplicaSpec, build_app, ray_serve

    spec = ReplicaSpec(args.model, args.weights, args.tokenizer, config)
    made = None
    if _demo_adapters(args):  # the built-in demo: write the generated adapters as PEFT folders
        model, _, base = load_served_model(args.model, args.weights, args.tokenizer)
        made = tempfile.mkdtemp(prefix="legato-adapters-")
        for name, adapter in generated_adapters(model).items():
            save_adapter(adapter, Path(made) / name, base)
    try:
        folders = [made] if made else args.adapters or []
        app = build_app(spec, folders, args.replicas, args.adapters_per_replica, access)
        with ray_serve(app, args.host, args.port, max(os.cpu_count() or 1, args.replicas)) as url:
            print(f"serving {args.replicas} replicas of {args.model} on {url}/v1 (Ray Serve); "
                  "Ctrl-C stops", file=sys.stderr)  # fmt: skip
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0


def _generate(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.serve.loading import load_adapters
    from legato.serve.sampling import SamplingParams

    def adapters(model):
        return load_adapters([args.adapter], model, "--adapter") if args.adapter else {}

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            stop=tuple(args.stop))  # fmt: skip
    engine = _engine(args, _engine_config(args), adapters)
    adapter = next(iter(engine.adapters), None)
    (request,) = engine.generate([engine.tokenizer.encode(args.prompt)], params, [adapter])
    if request.text:
        print(request.text)
    else:  # a bare empty line reads as a crash; say what happened
        n = len(request.output)
        how = "the model ended at once" if not n else f"no text from {n} token(s)"
        print(f"legato: empty answer: {how} (finish_reason: {request.finish_reason})",
              file=sys.stderr)  # fmt: skip
    return 0
