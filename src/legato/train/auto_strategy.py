"""``parallel.strategy = "auto"``: the planner's fastest plan for this job that the runtime runs.

The search is ``legato plan``'s (``plan.report.make_plan``) on the run's machine
(``train.prediction.resolve_machine``) for the config's global batch, sequence length
and dtype; its scorer first resolves each candidate into a ``Job`` as ``legato train``
would, so a plan the runtime refuses (tp on a MoE model, pp with tp, ...) counts as
invalid and the pick is always runnable. The chosen string carries ``mbs``, which sets
``train.micro_batch_size``; the rest of the config is kept.
"""

from __future__ import annotations

from legato.cost.training_step import predict
from legato.errors import ConfigError, LegatoError
from legato.parallel.job import AUTO, FIELD
from legato.plan.report import PlanReport, make_plan
from legato.plan.space import SearchSpace
from legato.specs.dtypes import DTYPE_KINDS
from legato.specs.model import ModelSpec
from legato.specs.strategy import Strategy
from legato.train.config import TrainConfig
from legato.train.prediction import Machine, resolve_machine


def resolve_auto(
    config: TrainConfig, spec: ModelSpec, nproc: int, device_type: str, say=print
) -> TrainConfig:
    """``config`` with ``parallel.strategy = "auto"`` replaced by the planner's pick (and
    the pick printed with ``say``); any other config unchanged."""
    if config.parallel.strategy != AUTO:
        return config
    machine = resolve_machine(config.parallel.cluster, nproc, device_type)
    if machine is None:
        raise ConfigError(
            f"{FIELD}: auto needs a machine to plan on: set parallel.cluster to a cluster "
            f"preset or a `legato calibrate` file (this host is not calibrated for {nproc} "
            f"process(es) yet; `legato train` does it before launching)"
        )
    report = plan_run(config, spec, nproc, machine)
    say(describe_choice(report))
    return config.with_strategy(report.result.best.strategy.to_string())


def plan_run(config: TrainConfig, spec: ModelSpec, nproc: int, machine: Machine) -> PlanReport:
    """The plans for ``config`` on ``nproc`` processes of ``machine``, fastest first."""
    priced = spec.with_(seq_len=config.data.seq_len or spec.seq_len)
    dtype = config.train.dtype

    def runnable(model: ModelSpec, cluster, strategy: Strategy):
        # the trainer's own check (the runtime's refusals, the config's rules) or an error,
        # which the search counts as an invalid candidate
        config.with_strategy(strategy.to_string()).job(spec, nproc)
        return predict(
            model,
            cluster,
            strategy,
            overlap=machine.overlap,
            runtime=machine.runtime,
            calibration=machine.calibration,
        )

    space = SearchSpace(dtype=DTYPE_KINDS[dtype].priced_as)
    try:
        return make_plan(
            priced, machine.cluster, config.train.global_batch_size, top_k=3,
            space=space, scorer=runnable,
        )  # fmt: skip
    except LegatoError as exc:
        raise ConfigError(f"{FIELD}: auto found no plan this runtime runs: {exc}") from None


def describe_choice(report: PlanReport) -> str:
    """The chosen plan, why, and the runner-up, in a few lines."""
    best = report.result.best
    p = best.prediction
    lines = [
        f"parallel.strategy = auto: {best.strategy.to_string()} on {report.cluster.name} "
        f"(predicted {p.step_time_s:.4f} s/step, {p.tokens_per_s:,.0f} tokens/s, "
        f"{p.memory_gib:.2f} GiB per device; {report.result.stats.scored} plans scored)"
    ]
    terms = p.breakdown
    comm = {k: round(v, 4) for k, v in terms.get("exposed_comm_s", {}).items() if v}
    lines.append(
        f"  why: compute {terms.get('compute_s', 0):.4f} s, exposed communication {comm or 0}, "
        f"bubble {terms.get('bubble_s', 0) or 0:.4f} s"
    )
    if report.runner_up:
        lines.append(f"  runner-up: {report.runner_up}")
    return "\n".join(lines)
