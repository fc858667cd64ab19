"""`legato predict` and `legato plan`: JSON contract, batch mode, one-line errors, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from legato.cli import main as cli

FIELDS = {"step_time_s", "tokens_per_s", "mfu", "memory_gib", "fits", "breakdown"}
GOOD = "dp=8,tp=8,sp=1,zero=1,gbs=256"


@pytest.fixture(autouse=True)
def only_plan_group(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("plan",))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_json(capsys):
    code, out, _ = run(capsys, "predict", "--model", "llama3-70b", "--cluster", "dgx-h100",
                       "--nodes", "8", "--strategy", GOOD, "--json")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert set(result) >= FIELDS
    assert (
        result["devices"] == 64
        and result["strategy"] == "dp=8,tp=8,pp=1,sp=1,zero=1,mbs=1,gbs=256,dtype=bf16"
    )
    assert {"compute_s", "bubble_s", "exposed_comm_s", "comm_s", "memory_gib"} <= set(
        result["breakdown"]
    )


def test_predict_table_and_files(capsys, tmp_path):
    model = tmp_path / "m.json"
    model.write_text(json.dumps({"hidden_size": 256, "num_layers": 4, "num_heads": 8,
                                 "vocab_size": 1024, "seq_len": 512}))  # fmt: skip
    code, out, _ = run(capsys, "predict", "--model", str(model), "--cluster", "dgx-a100",
                       "--strategy", "dp=4,tp=2,gbs=8", "--seq", "256")  # fmt: skip
    assert code == 0
    assert "step_time_s" in out and "exposed_comm_s" in out and "8 x dgx-a100" in out


@pytest.mark.parametrize(
    "strategy, fragment",
    [
        ("dp=8,tp=4,gbs=256", "pp*dp*cp*tp = 1*8*1*4 = 32 must equal the device count 64"),
        ("dp=8,tp=3,gbs=256", "must equal the device count 64"),
        ("dp=2,tp=32,gbs=256", "tp (32) must divide num_kv_heads (8)"),
        ("dp=8,tp=8,gbs=100", "gbs (100) must be a multiple of mbs*dp"),
        ("dp=8,tq=8", "bad item 'tq=8'"),
    ],
)
def test_impossible_strategy_is_one_line_exit_2(capsys, strategy, fragment):
    code, out, err = run(capsys, "predict", "--model", "llama3-70b", "--cluster", "dgx-h100",
                         "--nodes", "8", "--strategy", strategy)  # fmt: skip
    assert code == 2 and out == ""
    assert fragment in err and err.count("\n") == 1


def test_predict_without_target_says_what_is_missing(capsys):
    code, _, err = run(capsys, "predict", "--model", "llama3-8b")
    assert code == 2 and "--cluster, --strategy" in err


def test_batch_keeps_order_and_reports_bad_lines(capsys, tmp_path):
    lines = [
        {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": 8, "strategy": GOOD},
        {"model": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "vocab_size": 512,
                   "seq_len": 256}, "cluster": "dgx-a100",
         "strategy": {"dp": 2, "tp": "2x2", "sp": True, "gbs": 4}},
        "not json",
        {"model": "llama9", "cluster": "dgx-h100", "strategy": GOOD},
        {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": 8, "strategy": "dp=8,tp=3"},
        "",
        {"model": "llama3-8b", "cluster": "dgx-a100", "strategy": "dp=8,gbs=8", "seq": 4096},
    ]  # fmt: skip
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    code, out, err = run(capsys, "predict", "--batch", str(path))
    results = [json.loads(line) for line in out.splitlines()]
    assert code == 2 and "3 of the batch lines failed" in err
    assert len(results) == 6  # the blank line is skipped
    assert set(results[0]) >= FIELDS and results[0]["devices"] == 64
    assert results[1]["strategy"] == "dp=2,tp=2x2,pp=1,sp=1,zero=0,mbs=1,gbs=4,dtype=bf16"
    assert results[2]["error"].startswith("line 3: not a JSON object")
    assert "line 4: unknown model 'llama9'" in results[3]["error"]
    assert "line 5: strategy: pp*dp*cp*tp" in results[4]["error"]
    assert set(results[5]) >= FIELDS and results[5]["devices"] == 8


def test_plan_json(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                       "--nodes", "2", "--gbs", "64", "--top", "2", "--json")  # fmt: skip
    assert code == 0
    report = json.loads(out)
    assert report["devices"] == 16 and report["gbs"] == 64 and len(report["plans"]) == 2
    best = report["plans"][0]
    assert {"strategy", "tokens_per_s", "mfu", "memory_gib", "exposed_comm_s"} <= set(best)
    assert report["baseline"]["strategy"].startswith("dp=2,tp=8")
    assert report["gain_over_baseline"] == pytest.approx(
        best["tokens_per_s"] / report["baseline"]["tokens_per_s"]
    )
    assert report["search"]["scored"] > 0 and report["runner_up"].startswith("#2")


def test_plan_table(capsys):
    code, out, _ = run(capsys, "plan", "--model", "tiny", "--cluster", "dgx-a100", "--gbs", "16",
                       "--top", "3", "--max-tp", "2", "--no-2d")  # fmt: skip
    assert code == 0
    assert "tiny on 8 x dgx-a100" in out and "base" in out and "searched" in out


@pytest.mark.parametrize("columns", ["80", "200"])
def test_plan_table_keeps_strategy_strings_whole(capsys, monkeypatch, columns):
    """Each strategy string is copied from the table into --strategy: it must appear whole
    on one output line however narrow the terminal, beside its numbers when they fit."""
    monkeypatch.setenv("COLUMNS", columns)
    argv = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "4", "--gbs", "256"]
    _, out, _ = run(capsys, "plan", *argv, "--json")
    report = json.loads(out)
    code, out, _ = run(capsys, "plan", *argv)
    assert code == 0
    lines = out.splitlines()
    table_width = max(len(line) for line in lines if "tokens/s" in line)
    assert table_width <= int(columns)
    for rank, plan in [*enumerate(report["plans"], 1), ("base", report["baseline"])]:
        row = [line.split() for line in lines if line.split()[:1] == [str(rank)]]
        assert [plan["strategy"]] in [r[1:2] for r in row], (rank, plan["strategy"], out)
    beside = any(plan["strategy"] in line and "%" in line for line in lines)
    assert beside == (columns == "200")


def test_plan_that_fits_nowhere_says_why(capsys):
    code, out, err = run(capsys, "plan", "--model", "llama3-405b", "--cluster", "dgx-a100",
                         "--gbs", "8")  # fmt: skip
    assert code == 2 and out == ""
    assert "does not fit on 8 devices of 80 GiB" in err and "largest term" in err


def test_commands_do_not_import_torch(tmp_path):
    code = (
        "import sys, io, contextlib\n"
        "from legato.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plan', '--model', 'tiny', '--cluster', 'dgx-a100', '--gbs', '8', '--json'])\n"
        "    main(['predict', '--model', 'tiny', '--cluster', 'dgx-a100', '--strategy',"
        " 'dp=8,gbs=8', '--json'])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_plan_dtype_and_techniques(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "h800", "--gbs", "64",
                       "--top", "2", "--dtype", "fp8", "--json")  # fmt: skip
    assert code == 0
    report = json.loads(out)
    assert all("dtype=fp8" in p["strategy"] for p in report["plans"])
    assert "dtype=fp8" in report["baseline"]["strategy"]
    assert any("tile-wise FP8 block linears" in t for t in report["plans"][0]["techniques"])
    with pytest.raises(SystemExit) as exit_info:  # argparse rejects an unknown precision
        cli.main(["plan", "--model", "llama3-8b", "--cluster", "h800", "--gbs", "64",
                  "--dtype", "fp4"])  # fmt: skip
    assert exit_info.value.code == 2 and "invalid choice: 'fp4'" in capsys.readouterr().err


def test_predict_reports_overlap_and_swap(capsys):
    strategy = "dp=8,ep=8,gbs=8,recompute=full,moe_overlap=comet,moe_chunks=2,swap=1"
    code, out, _ = run(capsys, "predict", "--model", "mixtral-8x7b", "--cluster", "h800",
                       "--seq", "4096", "--strategy", strategy, "--json")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["strategy"] == (
        "dp=8,tp=1,pp=1,ep=8,zero=0,mbs=1,gbs=8,recompute=full,dtype=bf16,moe_overlap=comet,"
        "moe_chunks=2,swap=1"
    )
    breakdown = result["breakdown"]
    assert breakdown["moe_overlap"]["schedule"] == "comet"
    assert breakdown["swap"]["host_gib"] > 0 and breakdown["comm_s"]["host"] > 0


def _calibrated_cluster(tmp_path, overhead: float):
    """A cluster file with a `legato calibrate`-style side file beside it."""
    cluster = tmp_path / "local.toml"
    cluster.write_text('device = "cpu"\ndevices_per_node = 2\n'
                       'intra_node = { name = "gloo", bandwidth_gbps = 5, latency_us = 20.0 }\n')  # fmt: skip
    from legato.devices.profile_file import render_profile
    from legato.devices.registry import shipped_profile
    from legato.specs.typed import tomllib

    profile = tomllib.loads(render_profile(shipped_profile("cpu"), []))  # the host's profile
    side = {"measurement": {}, "calibration": {"kernel_overhead_s": overhead}, "profile": profile}
    (tmp_path / "local.calibration.json").write_text(json.dumps(side))
    return cluster


def _step(capsys, *argv: str) -> float:
    code, out, err = run(capsys, "predict", "--model", "tiny", "--strategy", "dp=2,zero=3,gbs=12",
                         "--no-overlap", "--json", *argv)  # fmt: skip
    assert code == 0, err
    return json.loads(out)["step_time_s"]


def test_predict_uses_the_side_file_or_calibration_flag(capsys, tmp_path):
    cluster = str(_calibrated_cluster(tmp_path, 1e-3))
    plain = _step(capsys, "--cluster", "local-cpu")
    beside = _step(capsys, "--cluster", cluster)
    assert beside > plain  # the side file's kernel overhead is counted
    flat = tmp_path / "zero.json"
    flat.write_text(json.dumps({"kernel_overhead_s": 0.0}))
    assert _step(capsys, "--cluster", cluster, "--calibration", str(flat)) == plain  # flag wins
    given = _step(
        capsys, "--cluster", "local-cpu", "--calibration", str(tmp_path / "local.calibration.json")
    )
    assert given == beside
    line = {"model": "tiny", "cluster": cluster, "strategy": "dp=2,zero=3,gbs=12"}
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps(line) + "\n")
    code, out, _ = run(capsys, "predict", "--batch", str(batch), "--no-overlap")
    assert code == 0 and json.loads(out)["step_time_s"] == beside


def test_bad_calibration_file_is_one_line_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kernel_overhead": 1e-3}))
    code, out, err = run(capsys, "predict", "--model", "tiny", "--cluster", "local-cpu",
                         "--strategy", "dp=2,gbs=12", "--calibration", str(bad))  # fmt: skip
    assert code == 2 and out == ""
    assert "calibration.kernel_overhead: unknown field" in err and err.count("\n") == 1


def test_plan_scores_with_the_calibration(capsys, tmp_path):
    cluster = str(_calibrated_cluster(tmp_path, 1e-3))
    steps = []
    for src in ("local-cpu", cluster):
        code, out, err = run(capsys, "plan", "--model", "tiny", "--cluster", src, "--gbs", "12",
                             "--dtype", "fp32", "--json")  # fmt: skip
        assert code == 0, err
        steps.append(json.loads(out)["plans"][0]["step_time_s"])
    assert steps[1] > steps[0]


def test_runtime_keys_change_the_price_on_the_command_line_and_per_batch_line(capsys, tmp_path):
    """Materialised attention with dropout is slower than flash attention; fp32 gradient
    reduction doubles ZeRO-3's reduce-scatter bytes; a --batch line's runtime overrides
    --runtime's, a bad one fails that line only."""
    target = ("--model", "llama3-8b", "--cluster", "dgx-a100", "--nodes", "2", "--json")
    strategy = "dp=16,zero=3,gbs=32"

    def step(*runtime: str) -> dict:
        code, out, err = run(capsys, "predict", *target, "--strategy", strategy, *runtime)
        assert code == 0, err
        return json.loads(out)

    plain, eager = step(), step("--runtime", "flash_attention=0,dropout=1")
    assert eager["breakdown"]["compute_s"] > 1.1 * plain["breakdown"]["compute_s"]
    fp32 = step("--runtime", "grad_reduce_bytes=4")
    assert fp32["breakdown"]["comm_s"]["dp"] > 1.2 * plain["breakdown"]["comm_s"]["dp"]
    line = {"model": "llama3-8b", "cluster": "dgx-a100", "nodes": 2, "strategy": strategy}
    batch = tmp_path / "b.jsonl"
    batch.write_text("\n".join(json.dumps(x) for x in (
        line, {**line, "runtime": {"flash_attention": False, "dropout": True}},
        {**line, "runtime": "grad_reduce_bytes=3"},
    )) + "\n")  # fmt: skip
    code, out, _ = run(capsys, "predict", "--batch", str(batch), "--runtime", "grad_reduce_bytes=4")
    results = [json.loads(x) for x in out.splitlines()]
    assert code == 2 and len(results) == 3
    assert results[0]["breakdown"]["comm_s"] == fp32["breakdown"]["comm_s"]
    assert results[1]["breakdown"]["compute_s"] == eager["breakdown"]["compute_s"]
    assert (
        "line 3: runtime.grad_reduce_bytes: must be 2 (bf16/fp16) or 4 (fp32)"
        in results[2]["error"]
    )


@pytest.mark.parametrize(
    ("runtime", "fragment"),
    [
        ("flash=0", "--runtime: bad item 'flash=0'; expected key=value with key in"),
        ("dropout=2", "--runtime.dropout: must be 0/1/true/false, got '2'"),
        ("host_link_gbps=-1", "--runtime.host_link_gbps: must be > 0"),
    ],
)
def test_bad_runtime_is_one_line_exit_2(capsys, runtime, fragment):
    code, out, err = run(capsys, "plan", "--model", "tiny", "--cluster", "local-cpu",
                         "--gbs", "12", "--runtime", runtime)  # fmt: skip
    assert code == 2 and out == "" and fragment in err and err.count("\n") == 1


def test_plan_scores_with_the_runtime(capsys):
    """Under materialised attention with dropout the plan differs from the default one, and
    prices (with that runtime) no slower than the default plan does."""
    eager = ("--runtime", "flash_attention=0,dropout=1")
    target = ("--model", "llama3-8b", "--cluster", "dgx-a100", "--json")
    plans = []
    for runtime in ((), eager):
        code, out, err = run(capsys, "plan", *target, "--gbs", "16", "--top", "1", *runtime)
        assert code == 0, err
        plans.append(json.loads(out)["plans"][0])
    assert plans[0]["strategy"] != plans[1]["strategy"]
    code, out, _ = run(capsys, "predict", *target, "--strategy", plans[0]["strategy"], *eager)
    assert plans[1]["step_time_s"] <= json.loads(out)["step_time_s"]


def test_a_multi_node_plan_config_names_the_torchrun_command(capsys, monkeypatch, tmp_path):
    """The config records nodes x processes per node, and `legato train` on one host says
    how to start it instead of failing on the device count."""
    from legato.train.config import load_config

    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("plan", "train"))
    out = tmp_path / "plan.toml"
    code, _, err = run(capsys, "plan", "--model", "llama3-8b", "--cluster", "dgx-h100",
                       "--nodes", "8", "--gbs", "512", "--config", str(out))  # fmt: skip
    script = tmp_path / "plan.torchrun.sh"
    assert code == 0 and f"wrote {out} and {script}" in err
    parallel = load_config(out).parallel
    assert (parallel.nodes, parallel.nproc) == (8, 8)
    code, _, err = run(capsys, "train", str(out), "--train.steps", "10")
    launcher = "torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint"
    command = f"{launcher} HOST:29500 -m legato.cli.main train {out} --train.steps=10"
    assert code == 2 and err.strip() == (
        "legato: error: parallel.nodes: the job runs on 64 processes (8 hosts x 8) and "
        "`legato train` starts them on this host only; run on every host, with HOST the "
        f"first host's address: {command}"
    )
    # the script beside the config runs the same command, HOST taken from the environment
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/sh" and lines[-1] == (
        f'exec {launcher} "${{HOST:?set HOST to the first host\'s address}}:29500" '
        f"-m legato.cli.main train {out}"
    )
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    echoed = script.read_text().replace("exec torchrun", "echo torchrun")
    shown = subprocess.run(["sh", "-c", echoed], env={"HOST": "10.0.0.1", "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True).stdout  # fmt: skip
    assert shown.strip() == command.replace("HOST:", "10.0.0.1:").removesuffix(" --train.steps=10")


def test_config_rank_writes_the_kth_plan(capsys, tmp_path):
    """--config-rank 2 writes plan #2 (one host: no torchrun script), a K past the plans
    shown or without --config is one line."""
    out = tmp_path / "second.toml"
    target = ("--model", "tiny", "--cluster", "local-cpu", "--gbs", "12", "--dtype", "fp32")
    code, data, _ = run(capsys, "plan", *target, "--json")
    second = json.loads(data)["plans"][1]["strategy"]
    code, _, err = run(capsys, "plan", *target, "--config", str(out), "--config-rank", "2")
    assert code == 0 and f"wrote {out}: plan #2, {second}" in err
    from legato.train.config import load_config

    assert load_config(out).parallel.strategy == second
    assert not (tmp_path / "second.torchrun.sh").exists()
    for argv, fragment in (
        (("--config", str(out), "--config-rank", "9", "--top", "3"),
         "--config-rank: must be in [1, --top = 3], got 9"),
        (("--config-rank", "1"), "--config-rank: needs --config OUT.toml"),
    ):  # fmt: skip
        code, _, err = run(capsys, "plan", *target, *argv)
        assert code == 2 and fragment in err and err.count("\n") == 1


def test_config_writes_a_plan_with_expert_parallelism_folded_over_tp(capsys, tmp_path):
    """A plan whose ep folds over the tensor-parallel ranks is written like any other and
    resolves to the job `legato train` runs."""
    from legato.specs.strategy import Strategy
    from legato.train.config import load_config, resolve_model

    target = ("--model", "tiny-moe", "--cluster", "local-cpu", "--gbs", "8", "--dtype", "fp32",
              "--top", "100")  # fmt: skip
    code, data, _ = run(capsys, "plan", *target, "--json")
    ranked = [plan["strategy"] for plan in json.loads(data)["plans"]]
    rank = next(k for k, text in enumerate(ranked, 1) if Strategy.parse(text).folded_ep)
    out = tmp_path / "folded.toml"
    code, _, err = run(capsys, "plan", *target, "--config", str(out), "--config-rank", str(rank))
    assert code == 0 and f"wrote {out}: plan #{rank}, {ranked[rank - 1]}" in err
    config = load_config(out)
    job = config.job(resolve_model(config.model), config.parallel.nproc)
    assert job.strategy.folded_ep and job.strategy.ep == job.strategy.tp * job.strategy.dp
