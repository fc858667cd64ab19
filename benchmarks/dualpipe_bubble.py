"""DualPipe against the one-copy schedules, simulated: bubble and activation memory.

For p pipeline ranks and m micro-batches, each of DualPipe, ZB-V, ZB-H1 and 1F1B is
built by ``legato.schedule`` and run by its simulator under the same per-micro-batch
forward, input-gradient and weight-gradient times (f, b, w of one rank's share; ZB-V's
two chunks split it). Rows: metric ``bubble_over_work`` (idle time of the busiest rank
over its compute), ``value`` DualPipe's, ``baseline_value`` the other schedule's, and
``peak_units`` (activations held at peak, in micro-batches of one rank's share) beside
it. DualPipe's price is the second copy of the weights (2x parameter memory); the closed
form ``cost.pipeline.dualpipe_bubble`` is printed next to the simulated bubble.
``--png`` draws DualPipe's timeline at p = 8.

    python benchmarks/dualpipe_bubble.py [--png docs/images/dualpipe.png]
"""

from __future__ import annotations

import argparse

from legato.cost.pipeline import dualpipe_bubble
from legato.schedule import build_schedule, simulate
from legato.schedule.costs import CostModel
from legato.schedule.render import render_timeline_png
from report import emit

COSTS = {"f=b=w": (1.0, 1.0, 1.0), "b=2f, w=f": (1.0, 2.0, 1.0), "w=b/2": (1.0, 1.0, 0.5)}
BASELINES = ("zb-v", "zb-h1", "1f1b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", help="DualPipe's timeline at p=8, m=20, b=2f (PNG)")
    args = parser.parse_args()
    for p in (4, 8, 16):
        for m in (2 * p, 4 * p):
            for label, (f, b, w) in COSTS.items():
                costs = CostModel(f=f, b=b, w=w)
                dual = simulate(build_schedule("dualpipe", stages=p, microbatches=m), costs)
                work = m * (f + b + w)
                closed = dualpipe_bubble(p, f, b, w)
                for name in BASELINES:
                    kind = {"zb-v": {"costs": costs}, "zb-h1": {"costs": costs}}.get(name, {})
                    other = simulate(build_schedule(name, stages=p, microbatches=m, **kind), costs)
                    emit("dualpipe_bubble", {"p": p, "m": m, "costs": label, "against": name},
                         "bubble_over_work", (dual.makespan - work) / work, name,
                         (other.makespan - work) / work, digits=4, ratio_digits=3,
                         closed_form_bubble=round(closed, 6),
                         simulated_bubble=round(dual.makespan - work, 6),
                         peak_units=max(dual.peak_units),
                         baseline_peak_units=max(other.peak_fraction) * p,
                         parameter_copies=2)  # fmt: skip
    if args.png:
        costs = CostModel(f=1.0, b=2.0, w=1.0)
        result = simulate(build_schedule("dualpipe", stages=8, microbatches=20), costs)
        render_timeline_png(result, args.png)


if __name__ == "__main__":
    main()
