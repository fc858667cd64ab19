"""``legato bench serve``: load an OpenAI-compatible server the way ``vllm bench serve`` does.

Requests come from a synthetic stream (Gamma arrivals at ``--request-rate`` with
``--burstiness``, S-LoRA's adapter popularity ``--alpha``, uniform lengths) or from the
Azure LLM trace (``--trace``, time-compressed and length-scaled). Adapters are the ones the
server lists under its base model (``/v1/models``), the first ``--num-adapters`` of them.
The result is vLLM's metrics (TTFT, TPOT, ITL, end-to-end at the mean, median and
percentiles, throughput, goodput under ``--goodput ttft:MS tpot:MS``), printed and, with
``--save-result``, written as JSON. A request that failed is reported with its reason on
stderr and the exit code is then 1; an empty completion (the model ended at once) is not a
failure (``serve/bench_client.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import Counter

import httpx

from legato.atomic import naming, write_text_atomic
from legato.cli.serve import API_KEY_ENV, resolve_api_key
from legato.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("bench", help="benchmark a running server")
    commands = group.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    commands.required = True
    serve = commands.add_parser("serve", help="send a request stream to a server, measure it")
    serve.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server")
    serve.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"the server's --api-key (default: ${API_KEY_ENV})",
    )  # fmt: skip
    serve.add_argument("--model", help="the base model's name (default: the server's)")
    serve.add_argument("--num-prompts", type=int, default=100)
    serve.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (inf)")
    serve.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape (1 = Poisson)")
    serve.add_argument("--num-adapters", type=int, help="adapters to spread requests over")
    serve.add_argument("--alpha", type=float, default=1.0, help="S-LoRA popularity (1 uniform)")
    serve.add_argument("--input-len", default="8,64", help="prompt tokens, uniform in [LO, HI)")
    serve.add_argument("--output-len", default="8,32", help="output tokens, uniform in [LO, HI)")
    serve.add_argument("--trace", help="an Azure LLM trace CSV instead of the synthetic stream")
    serve.add_argument("--time-scale", type=float, default=1.0, help="trace speed-up")
    serve.add_argument("--length-scale", type=float, default=1.0, help="trace length factor")
    serve.add_argument("--max-prompt-len", type=int, default=512)
    serve.add_argument("--max-output-len", type=int, default=128)
    serve.add_argument("--max-concurrency", type=int)
    serve.add_argument("--goodput", nargs="*", default=[], help="SLOs, e.g. ttft:500 tpot:50 (ms)")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--save-result", help="write the metrics as JSON here")
    serve.set_defaults(func=_bench_serve)


def _lengths(flag: str, text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag}: must be LO,HI (integers), got {text!r}") from None
    return lo, hi


def _slos(items: list[str]) -> dict[str, float]:
    slos = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in ("ttft", "tpot") or not value:
            raise ConfigError(f"--goodput: items are ttft:MS or tpot:MS, got {item!r}")
        try:
            slos[key] = float(value) / 1000.0
        except ValueError:
            raise ConfigError(f"--goodput: {item!r} needs a number of milliseconds") from None
    return slos


def _served(base_url: str, model: str | None, api_key: str | None) -> tuple[str, list[str]]:
    """The base model's name and its adapters, from ``/v1/models``."""
    from legato.serve.bench_client import bearer

    try:
        rows = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10, trust_env=False,
                         headers=bearer(api_key))  # fmt: skip
        if rows.status_code == 401:
            raise ConfigError(f"--api-key: the server at {base_url} wants a valid API key")
        rows.raise_for_status()
        data = rows.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise ConfigError(f"--base-url: no OpenAI server answers at {base_url} ({exc})") from None
    ids = [r["id"] for r in data]
    if not ids:
        raise ConfigError(f"--base-url: the server at {base_url} lists no models")
    if model is not None and model not in ids:  # fail now, not with every request
        raise ConfigError(f"--model: the server at {base_url} does not serve {model!r}; "
                          f"it lists {', '.join(ids)}")  # fmt: skip
    bases = [r["id"] for r in data if not r.get("parent")]
    base = model or (bases[0] if bases else ids[0])
    return base, [r["id"] for r in data if r.get("parent") == base]


def _bench_serve(args: argparse.Namespace, _extra: list[str]) -> int:
    from legato.serve.bench_client import run_benchmark
    from legato.serve.bench_metrics import summarize
    from legato.serve.workload import azure_trace, synthetic

    slos = _slos(args.goodput)
    key = resolve_api_key(args)
    base, adapters = _served(args.base_url, args.model, key)
    if args.num_adapters is not None:
        if not 0 <= args.num_adapters <= len(adapters):
            raise ConfigError(
                f"--num-adapters: the server has {len(adapters)} adapters, got {args.num_adapters}"
            )
        adapters = adapters[: args.num_adapters]
    if args.trace:
        requests = azure_trace(args.trace, args.num_prompts, adapters, args.alpha, args.time_scale,
                               args.length_scale, args.max_prompt_len, args.max_output_len,
                               args.seed)  # fmt: skip
    else:
        requests = synthetic(args.num_prompts, args.request_rate, args.burstiness, adapters,
                             args.alpha, _lengths("--input-len", args.input_len),
                             _lengths("--output-len", args.output_len), args.seed)  # fmt: skip
    timings, duration = asyncio.run(
        run_benchmark(args.base_url, base, requests, args.max_concurrency, api_key=key)
    )
    result = summarize(timings, duration, slos.get("ttft"), slos.get("tpot"))
    result |= {"model": base, "adapters": len(adapters), "alpha": args.alpha,
               "request_rate": args.request_rate, "burstiness": args.burstiness,
               "trace": args.trace}  # fmt: skip
    for key in ("completed", "failed", "request_throughput", "output_throughput",
                "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                "mean_e2el_ms", "request_goodput"):  # fmt: skip
        value = result.get(key)
        print(f"{key:<22} {value:.2f}" if isinstance(value, float) else f"{key:<22} {value}")
    if args.save_result:
        with naming("--save-result"):
            write_text_atomic(args.save_result, json.dumps(result, indent=2))
        print(f"wrote {args.save_result}")
    _report_failures(timings)
    return 0 if not result.get("failed") else 1


def _report_failures(timings, shown: int = 5) -> None:
    """Each distinct reason requests failed for (the first ``shown``), with its count, on
    stderr: a failed count alone says nothing of what to fix."""
    reasons = Counter(t.error for t in timings if not t.ok)
    for reason, count in reasons.most_common(shown):
        print(f"failed: {count} request(s): {reason}", file=sys.stderr)
    if len(reasons) > shown:
        print(f"failed: ... and {len(reasons) - shown} other reason(s)", file=sys.stderr)
