"""Multi-LoRA serving: ELORA's pool policy against vLLM's and S-LoRA's on the same engine.

One model (the tiny preset), one device pool tight enough that adapters and KV compete
(``--num-blocks``), one request stream per case replayed in wall-clock time into an
in-process engine under each policy in turn (no HTTP, so only the policy differs). Each
adapter is a task with its own 32-token instruction that every one of its prompts starts
with (the prefix its KV blocks cache). Streams: S-LoRA's synthetic workload (Gamma arrivals
with burstiness 1/cv^2, power-law adapter popularity ``alpha``, uniform lengths) over a grid
of adapters x alpha, and the Azure 2023 conversation trace (time-compressed, lengths
scaled), at several request rates.

Rows per case and rate: mean and p99 TTFT and mean TPOT of ``elora`` against ``vllm`` (ratio
ELORA / vLLM, < 1: ELORA better) and against ``slora``, with each policy's share of device KV
blocks whose adapter was not resident (sampled every step) and bytes swapped in; the peak
request rate with p99 TTFT under ``--slo-ttft-ms`` per policy (ratio ELORA / vLLM, > 1
better); and the measured (adapter load time / median decode step) the link default is set
by; and the engine's output tokens/s against HF PEFT generating the same 32 requests one
at a time (``set_adapter`` per request); and the ablation of ELORA's tree and of its cost
model on the contended cases. ``--png`` draws TTFT and TPOT against the rate. ``--host-kv``
runs only the host KV tier's comparison: on the contended cases, each policy with
``--swap-space-mb`` of host memory for evicted KV blocks against itself dropping them
(medians of ``--repeats`` runs; ratio with / without, < 1: the host tier helps).

    python benchmarks/serving_policies.py [--quick] [--png docs/images/serving_policies.png]
    python benchmarks/serving_policies.py --host-kv [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from legato.data.tokenizer import ByteTokenizer
from legato.models import build_model
from legato.serve.engine import Engine, EngineConfig
from legato.serve.loading import generated_adapters
from legato.serve.policies import POLICIES, EloraPolicy
from legato.serve.sampling import SamplingParams
from legato.serve.workload import azure_trace, prompt_text, synthetic
from legato.specs.registry import load_model
from report import emit, note

BENCHMARK = "serving_policies"
AZURE = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "serving" / "azure_llm_2023_conv.csv"
)
INSTRUCTION = 32  # tokens of each adapter's task instruction


def replay(engine: Engine, stream, instructions: dict) -> dict:
    """Feed ``stream`` into ``engine`` at its arrival times; per-request latencies and the
    pool's state as it ran."""
    tokenizer = engine.tokenizer
    prompts = [instructions[r.adapter] + tokenizer.encode(prompt_text(r.prompt_tokens, r.index))
               for r in stream]  # fmt: skip
    pending = sorted(range(len(stream)), key=lambda i: stream[i].arrival_s)
    done, orphans, steps = {}, [], []
    t0 = time.monotonic()
    live = []
    while pending or engine.has_work:
        now = time.monotonic() - t0
        while pending and stream[pending[0]].arrival_s <= now:
            i = pending.pop(0)
            params = SamplingParams(max_tokens=stream[i].output_tokens, temperature=0,
                                    ignore_eos=True)  # fmt: skip
            live.append((i, engine.add(prompts[i], params, stream[i].adapter)))
        if not engine.has_work:
            time.sleep(max(0.0, min(0.01, stream[pending[0]].arrival_s - now)))
            continue
        began = time.perf_counter()
        changed = engine.step()
        if changed and all(len(r.output) > 1 for r in changed):
            steps.append(time.perf_counter() - began)  # a decode step
        orphans.append(engine.memory.kv_without_adapter())
        for i, request in list(live):
            if request.finish_reason is not None:
                done[i] = (request, time.monotonic())
                live.remove((i, request))
    ttft, tpot = [], []
    for i, (request, end) in done.items():
        arrival = t0 + stream[i].arrival_s
        ttft.append(request.first_token_s - arrival)
        if len(request.output) > 1:
            tpot.append((end - request.first_token_s) / (len(request.output) - 1))
    return {
        "mean_ttft_s": float(np.mean(ttft)),
        "p99_ttft_s": float(np.percentile(ttft, 99)),
        "mean_tpot_s": float(np.mean(tpot)),
        "kv_without_adapter": float(np.mean(orphans)) if orphans else 0.0,
        "swapped_in_mb": engine.memory.swapped_in_bytes / 1e6,
        "decode_step_s": statistics.median(steps) if steps else None,
        "prefix_hits": engine.blocks.hits,
    }


def run_case(model, adapters, stream, args, policies=POLICIES, swap_space=0) -> dict[str, dict]:
    """``stream`` under each policy (a name, or a zero-argument factory for a variant);
    ``swap_space`` bytes of host memory for evicted KV blocks."""
    tokenizer = ByteTokenizer()
    rng = np.random.default_rng(0)
    instructions = {name: rng.integers(97, 123, INSTRUCTION).tolist() for name in adapters}
    out = {}
    for policy in policies:
        chosen = policy if isinstance(policy, str) else policy()
        config = EngineConfig(block_size=16, num_blocks=args.num_blocks, max_num_seqs=16,
                              policy=chosen, max_loras=args.max_loras, swap_space=swap_space)  # fmt: skip
        engine = Engine(model, tokenizer, adapters, config)
        out[engine.policy.name] = {**replay(engine, stream, instructions),
                                   "host_hits": engine.memory.host_kv.hits}  # fmt: skip
    return out


ABLATION_CASES = ((20, 1.0, 32.0), (20, 1.0, 64.0), (50, 0.3, 64.0), (50, 1.0, 64.0))


def ablation(model, args) -> None:
    """ELORA against itself without the dependency tree (Eval over every idle item) and
    without the cost model (the tree's leaves in LRU order), on the contended cases."""
    variants = ("elora", lambda: EloraPolicy(tree=False), lambda: EloraPolicy(cost_model=False))
    for count, alpha, rate in ABLATION_CASES:
        adapters = generated_adapters(model, count=count, rank=8)
        stream = synthetic(args.num_prompts, rate, 1.0, list(adapters), alpha, (8, 64), (8, 32))
        results = run_case(model, adapters, stream, args, variants)
        case = {"stream": "synthetic", "adapters": count, "alpha": alpha, "rate": rate,
                "ablation": True}  # fmt: skip
        for base in ("elora-no-tree", "elora-lru"):
            for metric in ("mean_ttft_s", "p99_ttft_s", "mean_tpot_s", "kv_without_adapter"):
                emit(BENCHMARK, case, metric, results["elora"][metric], base,
                     results[base][metric], digits=4, ratio_digits=3)  # fmt: skip


def host_kv(model, args) -> None:
    """Each policy with ``--swap-space-mb`` of host memory for evicted KV blocks against the
    same policy dropping them, on the contended cases; medians over ``--repeats`` runs."""
    for count, alpha, rate in ABLATION_CASES:
        adapters = generated_adapters(model, count=count, rank=8)
        stream = synthetic(args.num_prompts, rate, 1.0, list(adapters), alpha, (8, 64), (8, 32))
        runs = [(run_case(model, adapters, stream, args, swap_space=int(args.swap_space_mb * 2**20)),
                 run_case(model, adapters, stream, args)) for _ in range(args.repeats)]  # fmt: skip
        for policy in POLICIES:
            case = {"stream": "synthetic", "adapters": count, "alpha": alpha, "rate": rate,
                    "policy": policy, "swap_space_mb": args.swap_space_mb}  # fmt: skip
            for metric in ("mean_ttft_s", "p99_ttft_s", "mean_tpot_s"):
                emit(BENCHMARK, case, metric,
                     statistics.median(on[policy][metric] for on, _ in runs), "no_host_kv",
                     statistics.median(off[policy][metric] for _, off in runs), digits=4,
                     ratio_digits=3, host_hits=[on[policy]["host_hits"] for on, _ in runs],
                     prefix_hits=[on[policy]["prefix_hits"] for on, _ in runs],
                     prefix_hits_without=[off[policy]["prefix_hits"] for _, off in runs])  # fmt: skip


def report(case: dict, results: dict[str, dict]) -> None:
    elora = results["elora"]
    for base in ("vllm", "slora"):
        other = results[base]
        for metric in ("mean_ttft_s", "p99_ttft_s", "mean_tpot_s"):
            emit(BENCHMARK, case, metric, elora[metric], base, other[metric], digits=4,
                 ratio_digits=3)  # fmt: skip
    note(BENCHMARK, case=case, policies=results)


def throughput_vs_peft(model, adapters, stream, instructions) -> None:
    """What a user has today: HF PEFT generating one request at a time (``set_adapter`` per
    request) against the engine batching them all; output tokens per second."""
    import tempfile

    from peft import PeftModel

    from legato.lora.hf_interop import to_hf_llama
    from legato.lora.peft_io import save_adapter

    tokenizer = ByteTokenizer()
    prompts = [instructions[r.adapter] + tokenizer.encode(prompt_text(r.prompt_tokens, r.index))
               for r in stream]  # fmt: skip
    used = sorted({r.adapter for r in stream})
    with tempfile.TemporaryDirectory() as folder:
        hf = to_hf_llama(model)
        for name in used:
            save_adapter(adapters[name], Path(folder) / name, "tiny")
        peft = PeftModel.from_pretrained(hf, Path(folder) / used[0], adapter_name=used[0])
        for name in used[1:]:
            peft.load_adapter(Path(folder) / name, adapter_name=name)
        peft.eval()
        suppressed = list(range(tokenizer.vocab_size, model.spec.vocab_size))
        began = time.perf_counter()
        with torch.no_grad():
            for request, prompt in zip(stream, prompts, strict=True):
                peft.set_adapter(request.adapter)
                peft.generate(input_ids=torch.tensor([prompt]), max_new_tokens=request.output_tokens,
                              min_new_tokens=request.output_tokens, do_sample=False,
                              suppress_tokens=suppressed, pad_token_id=0)  # fmt: skip
        theirs = sum(r.output_tokens for r in stream) / (time.perf_counter() - began)
    engine = Engine(model, tokenizer, adapters, EngineConfig(num_blocks=512, policy="elora"))
    params = [SamplingParams(max_tokens=r.output_tokens, temperature=0, ignore_eos=True)
              for r in stream]  # fmt: skip
    began = time.perf_counter()
    requests = [
        engine.add(p, q, r.adapter) for p, q, r in zip(prompts, params, stream, strict=True)
    ]
    while engine.has_work:
        engine.step()
    ours = sum(len(r.output) for r in requests) / (time.perf_counter() - began)
    emit(BENCHMARK, {"requests": len(stream), "adapters": len(used)}, "output_tokens_per_s",
         ours, "hf_peft_one_at_a_time", theirs, digits=1, ratio_digits=2)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=160)
    parser.add_argument("--rates", default="8,16,32,64")
    parser.add_argument("--adapters", default="20,50")
    parser.add_argument("--alphas", default="0.3,1")
    parser.add_argument("--num-blocks", type=int, default=96)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--slo-ttft-ms", type=float, default=200.0)
    parser.add_argument("--quick", action="store_true", help="20 adapters, alpha 0.3, two rates")
    parser.add_argument("--png", type=Path)
    parser.add_argument(
        "--host-kv",
        action="store_true",
        help="only the host KV tier: each policy with and without swap space",
    )
    parser.add_argument("--swap-space-mb", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per --host-kv case")
    args = parser.parse_args()
    rates = [8.0, 32.0] if args.quick else [float(r) for r in args.rates.split(",")]
    counts = [20] if args.quick else [int(n) for n in args.adapters.split(",")]
    alphas = [0.3] if args.quick else [float(a) for a in args.alphas.split(",")]
    spec = load_model("tiny")
    model = build_model(spec, seed=0)
    if args.host_kv:
        note(BENCHMARK, model=spec.name, num_blocks=args.num_blocks, repeats=args.repeats,
             swap_space_mb=args.swap_space_mb, num_prompts=args.num_prompts)  # fmt: skip
        host_kv(model, args)
        return
    note(BENCHMARK, model=spec.name, num_blocks=args.num_blocks, max_loras=args.max_loras,
         num_prompts=args.num_prompts, rates=rates)  # fmt: skip
    sweep: dict[str, list[tuple[float, dict]]] = {p: [] for p in POLICIES}
    for count in counts:
        adapters = generated_adapters(model, count=count, rank=8)
        names = list(adapters)
        for alpha in alphas:
            for rate in rates:
                stream = synthetic(args.num_prompts, rate, 1.0, names, alpha, (8, 64), (8, 32))
                results = run_case(model, adapters, stream, args)
                case = {"stream": "synthetic", "adapters": count, "alpha": alpha, "rate": rate}
                report(case, results)
                if count == counts[0] and alpha == alphas[0]:
                    for policy, row in results.items():
                        sweep[policy].append((rate, row))
    if AZURE.is_file():
        adapters = generated_adapters(model, count=counts[0], rank=8)
        stream = azure_trace(AZURE, args.num_prompts, list(adapters), alphas[0], time_scale=2.0,
                             length_scale=0.1, max_prompt=128, max_output=32)  # fmt: skip
        report({"stream": "azure-2023-conv", "adapters": counts[0], "alpha": alphas[0],
                "time_scale": 2.0, "length_scale": 0.1}, run_case(model, adapters, stream, args))  # fmt: skip
    slo = args.slo_ttft_ms / 1000
    peak = {p: max((r for r, row in rows if row["p99_ttft_s"] <= slo), default=0.0)
            for p, rows in sweep.items()}  # fmt: skip
    case = {
        "stream": "synthetic",
        "adapters": counts[0],
        "alpha": alphas[0],
        "slo_ttft_ms": args.slo_ttft_ms,
    }
    for base in ("vllm", "slora"):
        emit(BENCHMARK, case, "peak_rate_under_slo", peak["elora"], base, peak[base], digits=2,
             ratio_digits=3)  # fmt: skip
    slot = Engine(model, ByteTokenizer(), generated_adapters(model, 1, rank=8)).memory
    load_s = slot.adapters["lora-0"].host.nbytes / slot.link_bytes_per_s
    steps = [
        row["decode_step_s"] for rows in sweep.values() for _, row in rows if row["decode_step_s"]
    ]
    note(BENCHMARK, adapter_load_s=load_s, median_decode_step_s=statistics.median(steps),
         load_over_step=load_s / statistics.median(steps))  # fmt: skip
    if args.png:
        render(sweep, args.png)
    adapters = generated_adapters(model, count=counts[0], rank=8)
    rng = np.random.default_rng(0)
    instructions = {name: rng.integers(97, 123, INSTRUCTION).tolist() for name in adapters}
    stream = synthetic(32, math.inf, 1.0, list(adapters), alphas[0], (8, 64), (8, 32), seed=1)
    throughput_vs_peft(model, adapters, stream, instructions)
    if not args.quick:
        ablation(model, args)


def render(sweep: dict[str, list[tuple[float, dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from legato.atomic import write_atomic

    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for policy, rows in sweep.items():
        rates = [r for r, _ in rows]
        ttft.plot(rates, [row["p99_ttft_s"] * 1000 for _, row in rows], marker="o", label=policy)
        tpot.plot(rates, [row["mean_tpot_s"] * 1000 for _, row in rows], marker="o", label=policy)
    ttft.set(xlabel="request rate (req/s)", ylabel="p99 TTFT (ms)", yscale="log")
    tpot.set(xlabel="request rate (req/s)", ylabel="mean TPOT (ms)")
    ttft.legend()
    fig.suptitle("tiny preset, device pool shared by KV and adapters")
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)


if __name__ == "__main__":
    main()
