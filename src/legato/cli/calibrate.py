"""``legato calibrate [--nproc N] [--out FILE] [--quick] [--json]``: measure this host.

Measures matmul throughput by shape, memory bandwidth, fused attention and the gloo
collectives between ``N`` processes (``legato.calibrate``), and writes a cluster
file that ``legato predict/plan --cluster FILE`` and ``load_cluster(FILE)`` read, with
the raw measurements beside it. Progress goes to stderr; stdout gets a summary, or JSON.
"""

from __future__ import annotations

import argparse
import json

DEFAULT_OUT = "local-cluster.toml"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine (matmul, memory, gloo collectives) and write a cluster file",
        description="Measure this host as N training processes see it and write a cluster "
        "file with the measured device peak, memory bandwidth and link.",
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="training processes on this host (default 2)"
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"cluster file to write (default {DEFAULT_OUT})"
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds, fewer shapes")
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from legato.calibrate.cluster_file import side_path, write_cluster_file
    from legato.calibrate.host import calibrate

    measurement = calibrate(args.nproc, quick=args.quick)
    path = write_cluster_file(measurement, args.out)
    if args.json:
        print(json.dumps({"cluster_file": str(path), **measurement.to_dict()}))
        return 0
    m = measurement
    print(f"wrote {path} (raw measurements: {side_path(path)}) in {m.seconds:.0f} s")
    print(
        f"  per process ({m.threads} thread(s)): GEMM fp32 {m.gemm_fit.peak_flops / 1e9:.1f} "
        f"GFLOP/s (half-efficiency size {m.gemm_fit.half_dim:.0f}), bf16 "
        f"{m.bf16_peak_flops / 1e9:.1f} GFLOP/s, copy {m.copy_bandwidth / 1e9:.2f} GB/s, "
        f"elementwise {m.elementwise_bandwidth / 1e9:.2f} GB/s"
    )
    if m.link is not None:
        print(
            f"  gloo link: {m.link.latency_s * 1e6:.1f} us per step, "
            f"{m.link.bandwidth / 1e9:.3f} GB/s (fit error {100 * m.link.error:.0f}%)"
        )
    return 0
