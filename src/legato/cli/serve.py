"""``legato serve`` (an OpenAI-compatible server) and ``legato generate`` (one answer).

Both load the same way (``serve/loading.py``): ``--model`` a legato run directory, or a
preset (random weights, or ``--weights`` HF safetensors); ``--adapters`` PEFT folders or
folders of them. With no ``--adapters``, ``serve`` makes four random ones (``lora-0`` ...)
so it runs on a fresh machine. Flag names follow vLLM's where it has one.
"""

from __future__ import annotations

import argparse
import sys

from legato.errors import ConfigError
from legato.serve.policies import DEFAULT_LINK_GBPS, POLICIES


def _model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="a legato run directory or a preset")
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
    parser.add_argument("--max-num-seqs", type=int, default=16, help="requests per batch")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="tokens per engine step"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="serve a model and LoRA adapters over HTTP")
    _model_flags(serve)
    serve.add_argument("--adapters", nargs="*", default=None, help="PEFT adapter folders")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429")
    serve.set_defaults(func=_serve)
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


def _engine(args: argparse.Namespace, adapters: dict):
    from legato.serve.engine import Engine, EngineConfig
    from legato.serve.loading import load_served_model

    if not args.link_gbps > 0:
        raise ConfigError(f"--link-gbps: must be > 0, got {args.link_gbps}")
    for flag in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_loras"):
        if getattr(args, flag) < 1:
            raise ConfigError(
                f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}"
            )
    if args.max_lora_rank < 0:
        raise ConfigError(f"--max-lora-rank: must be >= 0, got {args.max_lora_rank}")
    model, tokenizer, name = load_served_model(args.model, args.weights, args.tokenizer)
    config = EngineConfig(args.block_size, args.num_blocks, args.max_num_seqs,
                          args.max_num_batched_tokens, getattr(args, "max_queue", 256),
                          args.policy, args.max_loras, args.link_gbps, args.max_lora_rank)  # fmt: skip
    return Engine(model, tokenizer, adapters(model), config, model_name=name)


def _serve(args: argparse.Namespace, _extra: list[str]) -> int:
    import uvicorn

    from legato.serve.loading import generated_adapters, load_adapters
    from legato.serve.server import create_app

    def adapters(model):
        return load_adapters(args.adapters, model) if args.adapters else generated_adapters(model)

    engine = _engine(args, adapters)
    names = ", ".join(engine.adapters) or "none"
    print(f"serving {engine.model_name} with adapters {names} on http://{args.host}:{args.port}/v1",
          file=sys.stderr)  # fmt: skip
    uvicorn.run(create_app(engine, {n: n for n in engine.adapters}), host=args.host,
                port=args.port, log_level="warning")  # fmt: skip
    return 0


def _generate(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.serve.loading import load_adapters
    from legato.serve.sampling import SamplingParams

    def adapters(model):
        return load_adapters([args.adapter], model, "--adapter") if args.adapter else {}

    engine = _engine(args, adapters)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            stop=tuple(args.stop))  # fmt: skip
    adapter = next(iter(engine.adapters), None)
    (request,) = engine.generate([engine.tokenizer.encode(args.prompt)], params, [adapter])
    print(request.text)
    return 0
