"""How long ``legato plan`` takes on the largest jobs it is asked about.

Cases: Llama-3 405B on 16,384 H100 (2,048 DGX nodes, gbs 2,048) and DeepSeek-V3 (671B
MoE, its expert-parallel choices searched) on 2,048 H800 (gbs 4,096, 4,096-token
sequences). Each repeat runs the whole search in a fresh process, so no cache of an
earlier repeat helps; the figure is that process's CPU seconds for ``make_plan``
(wall seconds beside it), median over ``--repeats`` (default 3). The baseline is the
budget: 10 s to answer (``value / baseline_value`` below 1 meets it), 2 s the goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from report import emit

CASES = [
    ("llama3-405b", "dgx-h100", 2048, 2048, None),
    ("deepseek-v3", "h800", 256, 4096, 4096),
]
BUDGET_S, GOAL_S = 10.0, 2.0
CHILD = """
import json, sys, time
from legato.plan import make_plan
from legato.specs import load_cluster, load_model
model, cluster, nodes, gbs, seq = json.loads(sys.argv[1])
spec = load_model(model)
spec = spec.with_(seq_len=seq) if seq else spec
cluster = load_cluster(cluster, nodes=nodes)
cpu, wall = time.process_time(), time.perf_counter()
report = make_plan(spec, cluster, gbs)
print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                  "scored": report.result.stats.scored,
                  "best": report.result.best.strategy.to_string()}))
"""


def one_search(case: tuple) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], check=True,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per case")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    for case in CASES:
        runs = [one_search(case) for _ in range(args.repeats)]
        cpu = statistics.median(r["cpu_s"] for r in runs)
        model, cluster, nodes, gbs, seq = case
        where = {"model": model, "cluster": cluster, "nodes": nodes, "gbs": gbs, "seq": seq}
        emit("plan_speed", where,
             "plan_cpu_seconds", cpu, "budget_seconds", BUDGET_S, digits=2, ratio_digits=3,
             wall_seconds=round(statistics.median(r["wall_s"] for r in runs), 2),
             meets_goal=cpu <= GOAL_S, scored=runs[0]["scored"], best=runs[0]["best"],
             repeats=args.repeats)  # fmt: skip


if __name__ == "__main__":
    main()
