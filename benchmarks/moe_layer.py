"""MoE layer: plain all-to-all vs Domino-EP vs Comet chunked overlap, measured and predicted.

Measured (default): two processes (torch.multiprocessing spawn + gloo, one thread each)
run one expert-parallel MoE layer, forward + backward, under

* ``alltoall_then_gemm`` (the baseline: dispatch all-to-all, wait, grouped GEMMs,
  combine all-to-all, wait, as torchtitan and Megatron's all-to-all dispatcher do),
* ``domino`` (two token halves), ``comet`` (local rows first, remote rows in chunks,
  second GEMM in column groups),

plus the communication alone (the baseline's all-to-alls, forward and backward, same
split sizes) and the compute alone (one process, no communication, the ``E/2`` experts
of one rank on its ``tokens * top_k`` rows: the same FLOPs and weights per rank). ``hidden_fraction = (comm + compute - time) / comm``: the share of
the communication that ran under compute (negative when overlapping cost more than it
hid). Each case runs twice: ``compute: cpu`` (the GEMMs run on the same cores gloo needs
for its transfers) and ``compute: emulated_device`` (the activation also sleeps, in
forward and twice as long in backward, in total twice the measured communication time:
compute that leaves the host cores free, as a GPU kernel does). Then the grouped GEMM
(``torch._grouped_mm``) against a loop over experts, one process. Median over repeats of
the slower rank, variants interleaved within each repeat.

Predicted (``--predict``): ``cost.moe_layer_time`` for Mixtral 8x7B (EP 8 on one H800 node)
and DeepSeek-V3 (EP 64 over 8 H800 nodes), per-layer and end-to-end, beside Comet's
published averages (1.96x per layer, 1.71x end to end).

One JSON object per line; ``step_time_s``: lower is better; ``ratio = value /
baseline_value`` (below 1: faster than the baseline). ``--quick`` runs one small case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

from report import emit

BENCHMARK = "moe_layer"
BASELINE = "alltoall_then_gemm"


def _schedules() -> dict:
    from legato.moe import Overlap

    return {
        BASELINE: Overlap(),
        "domino": Overlap.domino(2),
        "comet_c2_g2": Overlap.comet(2, 2),
        "comet_c4_g2": Overlap.comet(4, 2),
    }


# ---------------------------------------------------------------- measured (2 processes)


def _layer(hidden: int, ffn: int, experts: int, top_k: int):
    import torch

    from legato.models.mlp import activate
    from legato.moe import MoELayer
    from legato.specs.model import MoESpec

    spec = MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=ffn)
    layer = MoELayer(hidden, spec, gated=True, bias=False, activation=activate)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * hidden**-0.5)
    return layer


def _comm_only(layer, x, group, ep: int) -> Callable[[], None]:
    """The baseline's communication alone: counts exchange, dispatch and combine
    all-to-alls forward and backward, with the split sizes of this routing."""
    import torch

    from legato.moe.comm import exchange_counts, start_all_to_all, wait_all_to_all

    with torch.no_grad():
        counts = layer.gate(x).counts
    rows = x.new_zeros(int(counts.sum()), x.shape[1])

    def run() -> None:
        recv = exchange_counts(counts.view(1, ep, -1), group)[0].sum(1).tolist()
        send = counts.view(ep, -1).sum(1).tolist()
        data = rows.clone().requires_grad_()
        arrived = wait_all_to_all(*start_all_to_all(data, send, recv, group))
        back = wait_all_to_all(*start_all_to_all(arrived * 1.0, recv, send, group))
        back.sum().backward()

    return run


def _sleepy(activation, seconds_per_row: float):
    """The activation plus ``seconds_per_row`` of host sleep per row in forward (twice
    that in backward): compute that, like a GPU kernel, leaves the host cores free."""
    import torch

    class Sleep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            time.sleep(seconds_per_row * h.shape[0])
            return h.view_as(h)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(2 * seconds_per_row * grad.shape[0])
            return grad

    return lambda up, gate: Sleep.apply(activation(up, gate))


def _worker(rank: int, store: str, cases: list[dict], repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    try:
        _mechanism(rank, dist, repeats)
        for case in cases:
            x = torch.randn(
                case["tokens"], case["hidden"], generator=torch.Generator().manual_seed(rank)
            )
            grad = torch.randn_like(x)
            samples = _timed(_runs(case, mesh, x, grad, None), repeats, dist)
            if rank == 0:
                _report({**case, "compute": "cpu"}, samples)
            # Emulated device compute: twice the (least disturbed) communication time.
            per_row = 2 * min(samples["comm_only"]) / (3 * case["tokens"] * case["top_k"])
            samples = _timed(_runs(case, mesh, x, grad, per_row), repeats, dist)
            if rank == 0:
                _report({**case, "compute": "emulated_device"}, samples)
    finally:
        dist.destroy_process_group()


def _mechanism(rank: int, dist, repeats: int) -> None:
    """Does gloo move data while the host is idle? One 16 MB all-to-all, then 30 ms of
    sleep: waited before the sleep (baseline) or after it (overlapped)."""
    import torch

    x = torch.randn(8192, 512)
    out = torch.empty_like(x)

    def alone() -> None:
        dist.all_to_all_single(out, x)

    def then_sleep() -> None:
        alone()
        time.sleep(0.03)

    def overlapped() -> None:
        work = dist.all_to_all_single(out, x, async_op=True)
        time.sleep(0.03)
        work.wait()

    runs = {"comm_only": alone, "alltoall_then_sleep": then_sleep, "overlapped": overlapped}
    times = {name: statistics.median(v) for name, v in _timed(runs, repeats, dist).items()}
    if rank == 0:
        comm, base = times["comm_only"], times["alltoall_then_sleep"]
        emit(
            BENCHMARK,
            {
                "check": "gloo_async_alltoall_under_idle_host",
                "bytes": x.numel() * 4,
                "sleep_s": 0.03,
            },
            "step_time_s",
            times["overlapped"],
            "alltoall_then_sleep",
            base,
            digits=6,
            ratio_digits=4,
            comm_only_s=round(comm, 6),
            hidden_fraction=round((comm + 0.03 - times["overlapped"]) / comm, 3),
        )


def _runs(case: dict, mesh, x, grad, sleep_per_row: float | None) -> dict[str, Callable[[], None]]:
    from legato.parallel.expert import apply_expert_parallel

    def layer(experts: int = case["experts"]):
        built = _layer(case["hidden"], case["ffn"], experts, case["top_k"])
        if sleep_per_row is not None:
            built.experts.activation = _sleepy(built.experts.activation, sleep_per_row)
        return built

    runs = {}
    for name, overlap in _schedules().items():
        ep_layer = layer()
        apply_expert_parallel(ep_layer, mesh, overlap)
        runs[name] = _step(ep_layer, x, grad)
    # Compute alone: one process, this rank's E/2 experts (same rows, FLOPs and weights).
    runs["compute_only"] = _step(layer(case["experts"] // 2), x, grad)
    runs["comm_only"] = _comm_only(layer(), x, mesh.get_group(), 2)
    return runs


def _step(layer, x, grad) -> Callable[[], None]:
    def run() -> None:
        layer.zero_grad(set_to_none=True)
        layer(x.requires_grad_()).backward(grad)

    return run


def _timed(runs: dict[str, Callable[[], None]], repeats: int, dist) -> dict[str, list[float]]:
    """``repeats`` samples of the slower rank's time per run, after one warm-up round."""
    import torch

    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for repeat in range(repeats + 1):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            runs[name]()
            elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if repeat:
                samples[name].append(elapsed.item())
    return samples


def _report(case: dict, samples: dict[str, list[float]]) -> None:
    """Medians (the figures), and minima (the least disturbed run on a shared machine)."""
    for stat in (statistics.median, min):
        times = {name: stat(values) for name, values in samples.items()}
        comm, compute, base = times["comm_only"], times["compute_only"], times[BASELINE]
        for name in _schedules():
            hidden = (comm + compute - times[name]) / comm
            emit(
                BENCHMARK,
                {**case, "ep": 2, "schedule": name, "statistic": stat.__name__},
                "step_time_s",
                times[name],
                BASELINE,
                base,
                digits=6,
                ratio_digits=4,
                comm_only_s=round(comm, 6),
                compute_only_s=round(compute, 6),
                hidden_fraction=round(hidden, 3),
            )


def measure(cases: list[dict], repeats: int) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "store"), cases, repeats), nprocs=2, join=True)


def grouped_gemm_vs_loop(cases: list[dict], repeats: int) -> None:
    """One process: the dropless layer with torch._grouped_mm against a loop over experts."""
    import torch

    torch.set_num_threads(1)
    for case in cases:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(case["tokens"], case["hidden"], dtype=dtype)
            grad = torch.randn_like(x)
            times = {}
            for impl in ("loop", "grouped_mm"):
                layer = _layer(case["hidden"], case["ffn"], case["experts"], case["top_k"]).to(
                    dtype
                )
                layer.experts.gemm_impl = impl
                run = _step(layer, x, grad)
                run()
                samples = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - start)
                times[impl] = statistics.median(samples)
            dtype_name = str(dtype).removeprefix("torch.")
            emit(
                BENCHMARK,
                {**case, "dtype": dtype_name, "impl": "grouped_mm", "processes": 1},
                "step_time_s",
                times["grouped_mm"],
                "loop_over_experts",
                times["loop"],
                digits=6,
                ratio_digits=4,
            )


# ---------------------------------------------------------------- predicted


PREDICTIONS = [  # model, cluster preset, nodes, ep, tokens per rank
    ("mixtral-8x7b", "h800", 1, 8, 4096),
    ("mixtral-8x7b", "h800", 1, 8, 16384),
    ("deepseek-v3", "h800", 8, 64, 4096),
    ("deepseek-v3", "h800", 8, 64, 16384),
]
COMET_COMM_SHARE = 0.47  # Comet's measured share of MoE time spent communicating


def predict() -> None:
    from legato.cost.calibration import CALIBRATION
    from legato.cost.compute import DeviceModel
    from legato.cost.flops import forward_flops
    from legato.cost.moe_layer_time import MoEWork, best_schedule, moe_layer_time, overlap_gain
    from legato.specs.params import mlp_params
    from legato.specs.registry import load_cluster, load_model

    fused = replace(CALIBRATION, base_latency_us=0.0)  # Comet's kernels: no per-chunk launch
    for name, preset, nodes, ep, tokens in PREDICTIONS:
        model = load_model(name)
        cluster = load_cluster(preset, nodes=nodes)
        device = DeviceModel.of(cluster.device, "bf16", CALIBRATION)
        seq = min(tokens, model.seq_len)
        fwd = forward_flops(model, tokens // seq, seq).total
        routed = 2 * tokens * model.moe.top_k * mlp_params(model, model.moe.expert_ffn_hidden_size)
        dense = 3 * (fwd - routed * model.num_moe_layers)
        work = MoEWork.of(model, tokens, ep)
        link = cluster.level_for_group(ep)
        plain = moe_layer_time(work, device, link, calibration=fused)
        # The same layer on a link slow enough for Comet's measured communication share.
        share = plain.comm_s / plain.seconds
        scale = share / (1 - share) * (1 - COMET_COMM_SHARE) / COMET_COMM_SHARE
        slow = replace(
            link,
            name=f"{link.name} x{scale:.2f} bandwidth",
            bandwidth_gbps=link.bandwidth_gbps * scale,
        )
        for link_, label, calibration in (
            (link, "nccl_calls", CALIBRATION),
            (link, "fused_kernels", fused),
            (slow, "fused_kernels", fused),
        ):
            for timing in (
                moe_layer_time(work, device, link_, "domino", 2, 1, calibration),
                moe_layer_time(work, device, link_, "comet", 4, 2, calibration),
                best_schedule(work, device, link_, calibration),
            ):
                gain = overlap_gain(model, device, link_, tokens, ep, dense, timing, calibration)
                case = {
                    "model": name,
                    "cluster": f"{preset} x{nodes}",
                    "link": link_.name,
                    "ep": ep,
                    "tokens_per_rank": tokens,
                    "latency": label,
                    "schedule": f"{timing.schedule} c{timing.chunks} g{timing.groups}",
                }
                emit(
                    BENCHMARK,
                    case,
                    "predicted_moe_layer_s",
                    timing.seconds,
                    BASELINE,
                    gain.plain.seconds,
                    digits=6,
                    ratio_digits=4,
                    comm_share_plain=round(gain.plain.comm_s / gain.plain.seconds, 3),
                    hidden_fraction=round(timing.hidden_fraction, 3),
                    layer_speedup=round(gain.layer, 3),
                    end_to_end_speedup=round(gain.end_to_end, 3),
                    published_layer_speedup=1.96,
                    published_end_to_end_speedup=1.71,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small case, under a minute")
    parser.add_argument("--predict", action="store_true", help="cost-model predictions only")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    if args.predict:
        predict()
        return
    # Fine-grained experts (ffn = hidden / 2, DeepSeek-V3's ratio is 0.29): communication
    # is a large share, as in the GPU settings Comet targets.
    base = {"experts": 8, "top_k": 2}
    sizes = [(1024, 256), (4096, 256), (1024, 512), (4096, 512)]
    if args.quick:
        sizes = sizes[:1]
    cases = [{"tokens": t, "hidden": h, "ffn": h // 2, **base} for t, h in sizes]
    repeats = args.repeats or (3 if args.quick else 9)
    measure(cases, repeats)
    grouped_gemm_vs_loop(cases, repeats)


if __name__ == "__main__":
    main()
