"""Pipeline schedules as data: IR, builders, validator, simulator, pictures.

Pure Python (no torch): the planner simulates these schedules and the runtime executes
the very same ``Schedule`` objects. See docs/pipeline_schedules.md.
"""

from legato.schedule.builders import (
    SCHEDULES,
    build_schedule,
    default_memory_cap,
    gpipe,
    interleaved,
    memory_floor,
    one_f_one_b,
    seq1f1b,
    svpp,
    zb_2p,
    zb_h1,
    zb_v,
)
from legato.schedule.costs import CostModel, MeasuredCosts
from legato.schedule.errors import ScheduleError
from legato.schedule.ir import Action, Schedule, StagePlacement
from legato.schedule.pareto import ParetoPoint, render_pareto_png, sweep, write_pareto_json
from legato.schedule.render import chrome_trace, render_timeline_png, write_chrome_trace
from legato.schedule.simulate import SimResult, TimedAction, simulate
from legato.schedule.slicing import slice_bounds, token_bounds
from legato.schedule.validate import check, validate

__all__ = [
    "SCHEDULES",
    "Action",
    "CostModel",
    "MeasuredCosts",
    "ParetoPoint",
    "Schedule",
    "ScheduleError",
    "SimResult",
    "StagePlacement",
    "TimedAction",
    "build_schedule",
    "check",
    "chrome_trace",
    "default_memory_cap",
    "gpipe",
    "interleaved",
    "memory_floor",
    "one_f_one_b",
    "render_pareto_png",
    "render_timeline_png",
    "seq1f1b",
    "simulate",
    "slice_bounds",
    "svpp",
    "sweep",
    "token_bounds",
    "validate",
    "write_chrome_trace",
    "write_pareto_json",
    "zb_2p",
    "zb_h1",
    "zb_v",
]
