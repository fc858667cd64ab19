"""Predicted against measured on every step, ``parallel.strategy = "auto"`` and
``legato plan --config``: from a plan to a running job whose log carries the prediction.

The host is calibrated by the first ``legato train`` of the session (``--quick``, cached
in the session's ``LEGATO_CACHE_DIR``) and read from the cache afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legato.cli.main import main
from legato.cost.calibration import CALIBRATION
from legato.cost.runtime import Runtime
from legato.cost.training_step import predict
from legato.specs import load_cluster
from legato.specs.strategy import Strategy
from legato.train import prediction
from legato.train.auto_strategy import plan_run
from legato.train.config import load_config, resolve_model
from legato.train.metrics import read_metrics, step_records
from legato.train.prediction import Machine, host_cluster_file, resolve_machine


def _train(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["train", *args]) == 0
    return capsys.readouterr().out


def test_every_step_logs_the_prediction_and_the_summary_compares(
    small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    out = _train(small_train_args(run, "--parallel.nproc=1"), capsys)
    assert host_cluster_file(1).is_file()  # calibrated once, then cached
    records = step_records(read_metrics(run / "metrics.jsonl"))
    predicted = {r["predicted_step_time_s"] for r in records}
    assert len(records) == 6 and len(predicted) == 1 and next(iter(predicted)) > 0
    summary = json.loads((run / "summary.json").read_text())
    ratio = summary["predicted_step_time_s"] / summary["step_time_s_median"]
    assert summary["predicted_over_measured_step"] == pytest.approx(ratio)
    memory = summary["predicted_peak_memory_bytes"] / summary["peak_memory_bytes"]
    assert summary["predicted_over_measured_memory"] == pytest.approx(memory)
    assert "predicted by the cost model on" in out and "step time: measured" in out
    # The prediction is the cost model's for this job on the cached calibration.
    config = load_config(None, small_train_args(run, "--parallel.nproc=1"))
    spec = resolve_model(config.model)
    machine = resolve_machine("", 1, "cpu")
    want = predict(spec, machine.cluster, config.job(spec, 1).strategy,
                   overlap=False, runtime=machine.runtime, calibration=machine.calibration)  # fmt: skip
    assert next(iter(predicted)) == pytest.approx(want.step_time_s)
    again = _train(small_train_args(tmp_path / "again", "--parallel.nproc=1"), capsys)
    assert "calibrating this host" not in again  # the cache is used


def test_no_prediction_with_cluster_none(
    small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _train(small_train_args(run, "--parallel.nproc=1", "--parallel.cluster=none"), capsys)
    records = step_records(read_metrics(run / "metrics.jsonl"))
    assert all(r["predicted_step_time_s"] is None for r in records)
    assert "predicted_step_time_s" not in json.loads((run / "summary.json").read_text())


def _auto_plans(preset: str, world: int):
    config = load_config(None, [f"--model.preset={preset}", "--parallel.strategy=auto"])
    spec = resolve_model(config.model)
    cluster = load_cluster("local-cpu", nodes=1, devices_per_node=world)
    machine = Machine(cluster, CALIBRATION, True, Runtime(), "local-cpu")
    return config, spec, plan_run(config, spec, world, machine)


def test_auto_picks_only_what_the_runtime_runs() -> None:
    """The planner also proposes layouts the runtime refuses (tiny-gpt on 4 processes:
    zero=1 with a tied embedding under zb-v); auto's ranking holds none of them: every
    ranked plan resolves into a Job."""
    config, spec, report = _auto_plans("tiny-gpt", 4)
    assert report.result.ranked
    assert "zero=1 with tied_embeddings" in report.result.stats.first_invalid  # dropped
    for scored in report.result.ranked:
        job = config.with_strategy(scored.strategy.to_string()).job(spec, 4)
        assert job.strategy.pp == scored.strategy.pp and job.strategy.tp == scored.strategy.tp


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-deepseek"])
def test_the_runtime_runs_every_moe_plan_on_two_processes(preset: str) -> None:
    """ep over the data ranks, folded over tp, under ZeRO 1-3: nothing the planner
    proposes for an MoE model on 2 processes is refused."""
    _, _, report = _auto_plans(preset, 2)
    assert report.result.ranked and report.result.stats.invalid == 0


def test_auto_runs_the_pick_and_says_why(
    small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    out = _train(small_train_args(run, "--parallel.nproc=1", "--parallel.strategy=auto"), capsys)
    assert "parallel.strategy = auto: " in out and "why: compute" in out
    [invocation] = [
        json.loads(line) for line in (run / "invocations.jsonl").read_text().splitlines()
    ]
    ran = invocation["config"]["parallel"]["strategy"]
    assert ran != "auto" and f"parallel.strategy = auto: {ran} " in out


def test_plan_writes_a_config_that_trains(
    small_train_args, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.toml"
    argv = ["plan", "--model", "tiny", "--cluster", "local-cpu", "--gbs", "8", "--dtype",
            "fp32", "--config", str(out)]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    config = load_config(out)
    assert f"wrote {out}: plan #" in err and config.parallel.strategy in err
    assert config.train.global_batch_size == 8 and config.parallel.cluster == ""
    run = tmp_path / "run"
    overrides = [
        a
        for a in small_train_args(run)
        if not a.startswith(("--train.global", "--train.micro", "--model.overrides"))
    ]
    _train([str(out), *overrides, "--model.overrides={num_layers = 1}"], capsys)
    ran = json.loads((run / "invocations.jsonl").read_text().splitlines()[0])["config"]
    assert ran["parallel"]["strategy"] == config.parallel.strategy


@pytest.mark.parametrize(("cores", "nproc", "speedup"), [(2, 1, 1.0), (2, 2, 1.0), (2, 4, 2.0),
                                                         (2, 8, 2.0), (16, 4, 1.0)])  # fmt: skip
def test_bubble_lends_cores_only_where_processes_share_them(monkeypatch, cores, nproc, speedup):
    monkeypatch.setattr(prediction, "host_cores", lambda: cores)
    monkeypatch.setattr(prediction, "threads_per_process", lambda n: max(1, cores // n))
    assert prediction.shared_host_bubble_speedup(nproc) == speedup


def test_a_faster_bubble_shortens_the_step_by_what_it_saves() -> None:
    """bubble_speedup divides the pipeline's bubble and nothing else."""
    cluster = load_cluster("dgx-h100", nodes=1)
    spec = resolve_model(load_config(None, []).model)
    pipeline = Strategy(pp=2, dp=4, mbs=1, gbs=8)
    slow = predict(spec, cluster, pipeline)
    fast = predict(spec, cluster, pipeline, runtime=Runtime(bubble_speedup=2.0))
    assert slow.breakdown["bubble_s"] > 0
    assert fast.breakdown["bubble_s"] == pytest.approx(slow.breakdown["bubble_s"] / 2)
    saved = slow.breakdown["bubble_s"] / 2
    assert fast.step_time_s == pytest.approx(slow.step_time_s - saved)
    assert fast.breakdown["compute_s"] == slow.breakdown["compute_s"]


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt", "tiny-moe", "tiny-deepseek"])
@pytest.mark.parametrize("world", [4, 8])
def test_the_planners_top_five_all_run(preset: str, world: int) -> None:
    """What the planner would tell a user to run, the trainer runs: each of the top 5
    plans of every family resolves into a Job (``benchmarks/top_plans_run.py`` checks
    the published-scale presets too)."""
    from legato.plan import SearchSpace, make_plan

    config = load_config(None, [f"--model.preset={preset}", "--train.global_batch_size=16"])
    spec = resolve_model(config.model)
    cluster = load_cluster("local-cpu", nodes=1, devices_per_node=world)
    report = make_plan(spec, cluster, 16, top_k=5, space=SearchSpace(dtype="fp32"))
    assert len(report.result.ranked) == 5
    for scored in report.result.ranked:
        config.with_strategy(scored.strategy.to_string()).job(spec, world)
