"""Bad inputs over every ``legato`` command and every HTTP endpoint of ``legato serve``.

Each CLI case runs in-process and must end with exit code 2 and exactly one error line on
stderr (``legato: error: ...``, or argparse's usage followed by its one ``error:`` line)
that names what is wrong, never a traceback. Each HTTP case must be a 4xx answer whose body
is OpenAI's error object (``{"error": {"message", "type", "param", "code"}}``) naming the
field in ``param`` where there is one. The inputs are chosen to fail during validation:
nothing here trains, calibrates, starts Ray or serves; a case whose bad input would be
accepted fails instead of starting the work.

A case marked ``xfail`` is a known defect in code another change owns; it is listed here so
that the fix turns it into a pass (``strict``: the mark must then go).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from legato.cli.main import main

# --- files the CLI cases read ({d} in a case's argv is their folder) -----------------------

_TASK = "[[tasks]]\nname = 'a'\ndata = 'x.jsonl'\n"
_JOB = "[[job]]\nname = 'x'\ntype = 'LM (batch size 20)'\nworkers = 1\nsteps = 10\narrival_s = 0\n"
_CLUSTER = "[cluster]\nnodes = 1\ndevices_per_node = 2\n"
_MODEL = "hidden_size = 64\nnum_layers = 2\nnum_heads = 4\nvocab_size = 300\nseq_len = 32\n"

FILES = {
    "plain.txt": "not a folder\n",
    "x.jsonl": '{"text": "hello"}\n',
    "model_negative.toml": _MODEL.replace("hidden_size = 64", "hidden_size = -64"),
    "model_unknown.toml": _MODEL + "layerz = 3\n",
    "model_syntax.json": '{"hidden_size": 64,,}',
    "cluster_device.toml": "device = 'z9000'\nnodes = 1\ndevices_per_node = 8\n",
    "cluster_zero_nodes.toml": "device = 'h100'\nnodes = 0\ndevices_per_node = 8\n",
    "calibration_unknown.json": '{"nope": 1}',
    "batch_bad.jsonl": "not json\n",
    "schedule_no_ranks.json": '{"stages": 2}',
    "schedule_syntax.json": '{"stages": ',
    "train_syntax.toml": "[train\nsteps = 3\n",
    "train_unknown.toml": "[train]\nstepz = 3\n",
    "train_wrong_type.toml": "[train]\nsteps = 'many'\n",
    "train_bad_section.toml": "[trian]\nsteps = 3\n",
    "ft_ok.toml": _TASK,
    "ft_syntax.toml": "[base\n",
    "ft_bad_section.toml": "[bsae]\npreset = 'tiny'\n" + _TASK,
    "ft_unknown_task_field.toml": _TASK + "rankk = 3\n",
    "ft_wrong_type.toml": _TASK + "rank = 'big'\n",
    "ft_zero_rank.toml": _TASK + "rank = 0\n",
    "ft_missing_data.toml": _TASK.replace("x.jsonl", "nope.jsonl"),
    "ft_duplicate.toml": _TASK + _TASK,
    "ft_bad_target.toml": _TASK + "target_modules = ['foo']\n",
    "philly_wrong_columns.csv": "a,b,c\n1,2,3\n",
    "azure_wrong_columns.csv": "a,b\n1,2\n",
    "jobs_syntax.toml": "[cluster\n",
    "jobs_unknown_type.toml": _CLUSTER + _JOB.replace("LM (batch size 20)", "nope"),
    "jobs_negative_workers.toml": _CLUSTER + _JOB.replace("workers = 1", "workers = -1"),
    "jobs_unknown_key.toml": _CLUSTER + _JOB + "foo = 1\n",
    "jobs_no_types.toml": _CLUSTER + _JOB,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad-inputs")
    for name, text in FILES.items():
        (folder / name).write_text(text)
    (folder / "empty").mkdir()
    return folder


# --- the CLI cases -------------------------------------------------------------------------


def cli(case_id: str, *argv: str, names: str, server: bool = False, fails: str = ""):
    """One bad command line; ``names``: what its error line must contain; ``server``:
    ``bench`` sees a server listing ``tiny`` and its adapter ``lora-0``; ``fails``: why it
    does not pass yet."""
    marks = [pytest.mark.xfail(strict=True, reason=fails)] if fails else []
    return pytest.param(list(argv), names, server, id=case_id, marks=marks)


TINY = ("--model", "tiny", "--cluster", "dgx-h100")
SIM = ("schedule", "simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4")
SVPP = ("schedule", "simulate", "--schedule", "svpp", "--stages", "2", "--microbatches", "4")
TRAIN = ("train", "--parallel.cluster=none", "--parallel.nproc=1")  # no host calibration
FT = ("finetune", "{d}/ft_ok.toml")
SIMULATE = ("cluster", "simulate")
PROFILE = ("cluster", "profile", "{d}/jobs_no_types.toml")
RUN = ("cluster", "run", "{d}/jobs_no_types.toml")
SERVE = ("serve", "--port", "0")  # bound and closed again; a server that starts fails the case
BENCH = ("bench", "serve", "--base-url", "http://127.0.0.1:1", "--num-prompts", "1")

# fmt: off
CLI_CASES = [
    # the command line itself
    cli("no-command", names="COMMAND"),
    cli("unknown-command", "trian", names="trian"),
    cli("unknown-flag", "predict", *TINY, "--strategy", "dp=8", "--bogus", names="--bogus"),
    # models, hardware
    cli("models-unknown-preset", "models", "llama9", names="llama9"),
    cli("models-negative-hidden-size", "models", "{d}/model_negative.toml", names="hidden_size"),
    cli("models-file-unknown-field", "models", "{d}/model_unknown.toml", names="layerz"),
    cli("models-file-bad-json", "models", "{d}/model_syntax.json", names="malformed JSON"),
    cli("models-missing-file", "models", "{d}/missing.toml", names="missing.toml"),
    cli("hardware-unknown-preset", "hardware", "dgx-z", names="dgx-z"),
    cli("hardware-zero-nodes", "hardware", "dgx-h100", "--nodes", "0", names="nodes"),
    cli("hardware-non-numeric-nodes", "hardware", "--nodes", "abc", names="--nodes"),
    cli("hardware-unknown-device", "hardware", "{d}/cluster_device.toml", names="z9000"),
    # predict
    cli("predict-unknown-strategy-key", "predict", *TINY, "--strategy", "dp=8,zz=2",
        names="zz=2"),
    cli("predict-non-numeric-dp", "predict", *TINY, "--strategy", "dp=abc", names="strategy.dp"),
    cli("predict-degrees-not-devices", "predict", *TINY, "--strategy", "dp=3",
        names="device count"),
    cli("predict-unknown-schedule", "predict", *TINY, "--strategy", "dp=8,schedule=nope",
        names="strategy.schedule"),
    cli("predict-negative-mbs", "predict", *TINY, "--strategy", "dp=8,mbs=-1",
        names="strategy.mbs"),
    cli("predict-missing-strategy", "predict", *TINY, names="--strategy"),
    cli("predict-zero-seq", "predict", *TINY, "--strategy", "dp=8", "--seq", "0",
        names="seq_len"),
    cli("predict-runtime-bad-value", "predict", *TINY, "--strategy", "dp=8",
        "--runtime", "flash_attention=7", names="--runtime.flash_attention"),
    cli("predict-runtime-unknown-key", "predict", *TINY, "--strategy", "dp=8",
        "--runtime", "nope=1", names="--runtime"),
    cli("predict-calibration-unknown-field", "predict", *TINY, "--strategy", "dp=8",
        "--calibration", "{d}/calibration_unknown.json", names="calibration.nope"),
    cli("predict-missing-batch-file", "predict", "--batch", "{d}/missing.jsonl",
        names="--batch"),
    cli("predict-batch-line-not-json", "predict", "--batch", "{d}/batch_bad.jsonl",
        names="batch lines failed"),
    # plan
    cli("plan-zero-gbs", "plan", *TINY, "--gbs", "0", names="gbs"),
    cli("plan-non-numeric-gbs", "plan", *TINY, "--gbs", "eight", names="--gbs"),
    cli("plan-zero-top", "plan", *TINY, "--gbs", "8", "--top", "0", names="--top"),
    cli("plan-zero-max-tp", "plan", *TINY, "--gbs", "8", "--max-tp", "0", names="max_tp"),
    cli("plan-unknown-dtype", "plan", *TINY, "--gbs", "8", "--dtype", "fp4", names="--dtype"),
    cli("plan-missing-cluster", "plan", "--model", "tiny", "--gbs", "8", names="--cluster"),
    cli("plan-cluster-file-zero-nodes", "plan", "--model", "tiny",
        "--cluster", "{d}/cluster_zero_nodes.toml", "--gbs", "8", names="cluster.nodes"),
    cli("plan-config-under-a-file", "plan", *TINY, "--gbs", "8", "--json",
        "--config", "{d}/plain.txt/out.toml", names="--config"),
    # calibrate
    cli("calibrate-zero-nproc", "calibrate", "--nproc", "0", names="--nproc"),
    cli("calibrate-non-numeric-nproc", "calibrate", "--nproc", "x", names="--nproc"),
    # schedule simulate / pareto / check
    cli("schedule-missing-subcommand", "schedule", names="SUBCOMMAND"),
    cli("schedule-unknown-name", "schedule", "simulate", "--schedule", "nope", "--stages", "2",
        "--microbatches", "4", names="--schedule"),
    cli("schedule-zero-stages", "schedule", "simulate", "--schedule", "1f1b", "--stages", "0",
        "--microbatches", "4", names="stages"),
    cli("schedule-negative-microbatches", "schedule", "simulate", "--schedule", "1f1b",
        "--stages", "2", "--microbatches", "-4", names="microbatches"),
    cli("schedule-non-numeric-cost", *SIM, "--cost", "f=abc", names="cost.f"),
    cli("schedule-unknown-cost-name", *SIM, "--cost", "zz=1", names="cost"),
    cli("schedule-option-not-taken", *SIM, "--chunks", "2", names="chunks"),
    cli("schedule-zero-slices", *SVPP, "--slices", "0", names="slices"),
    cli("schedule-memory-cap-below-floor", *SVPP, "--memory-cap", "-1", names="memory_cap"),
    cli("schedule-unknown-slicing", *SIM, "--slicing", "wrong", names="--slicing"),
    cli("schedule-save-under-a-file", *SIM, "--save", "{d}/plain.txt/s.json", names="--save"),
    cli("pareto-zero-stages", "schedule", "pareto", "--stages", "0", "--microbatches", "4",
        names="stages"),
    cli("pareto-non-numeric-chunks", "schedule", "pareto", "--stages", "2",
        "--microbatches", "4", "--chunks", "a,b", names="chunks"),
    cli("check-missing-file", "schedule", "check", "{d}/missing.json", names="missing.json"),
    cli("check-missing-ranks", "schedule", "check", "{d}/schedule_no_ranks.json",
        names="schedule.ranks"),
    cli("check-bad-json", "schedule", "check", "{d}/schedule_syntax.json",
        names="malformed JSON"),
    # train
    cli("train-toml-syntax", "train", "{d}/train_syntax.toml", names="malformed TOML"),
    cli("train-toml-unknown-field", "train", "{d}/train_unknown.toml", names="train.stepz"),
    cli("train-toml-wrong-type", "train", "{d}/train_wrong_type.toml", names="train.steps"),
    cli("train-toml-unknown-section", "train", "{d}/train_bad_section.toml", names="trian"),
    cli("train-missing-config", "train", "{d}/missing.toml", names="missing.toml"),
    cli("train-negative-steps", "train", "--train.steps=-1", names="train.steps"),
    cli("train-non-numeric-lr", "train", "--optim.lr=abc", names="optim.lr"),
    cli("train-override-without-section", "train", "--nosection=1", names="--nosection"),
    cli("train-unknown-preset", "train", "--model.preset=nope", names="model 'nope'"),
    cli("train-model-override-unknown-field", "train", "--model.overrides={layerz=2}",
        names="model.overrides.layerz"),
    cli("train-bad-strategy", "train", "--parallel.strategy=dp=2,zz=1",
        names="parallel.strategy"),
    cli("train-zero-nproc", "train", "--parallel.nproc=0", names="parallel.nproc"),
    cli("train-unknown-dtype", "train", "--train.dtype=fp4", names="train.dtype"),
    cli("train-unknown-device", "train", "--train.device=tpu", names="train.device"),
    cli("train-holdout-out-of-range", "train", "--data.holdout=1.5", names="data.holdout"),
    cli("train-missing-data-file", *TRAIN, "--data.paths={d}/nope.txt", names="data.paths"),
    cli("train-missing-resume", *TRAIN, "--checkpoint.resume={d}/no-checkpoint",
        names="checkpoint.resume"),
    cli("train-run-dir-is-a-file", *TRAIN, "--train.steps=1", "--run.dir={d}/plain.txt",
        names="run.dir"),
    # eval, export
    cli("eval-missing-run-dir", "eval", "{d}/no-run", names="RUN_DIR"),
    cli("eval-zero-batch-size", "eval", "{d}/empty", "--batch-size", "0", names="--batch-size"),
    cli("export-not-a-run-dir", "export", "{d}/empty", "{d}/out", names="RUN_DIR"),
    cli("export-unknown-format", "export", "{d}/empty", "{d}/out", "--format", "onnx",
        names="--format"),
    # finetune
    cli("finetune-no-config", "finetune", names="CONFIG"),
    cli("finetune-missing-config", "finetune", "{d}/missing.toml", names="missing.toml"),
    cli("finetune-toml-syntax", "finetune", "{d}/ft_syntax.toml", names="malformed TOML"),
    cli("finetune-unknown-section", "finetune", "{d}/ft_bad_section.toml", names="bsae"),
    cli("finetune-unknown-task-field", "finetune", "{d}/ft_unknown_task_field.toml",
        names="tasks.a.rankk"),
    cli("finetune-wrong-type", "finetune", "{d}/ft_wrong_type.toml", names="tasks.a.rank"),
    cli("finetune-zero-rank", "finetune", "{d}/ft_zero_rank.toml", names="tasks.a.rank"),
    cli("finetune-missing-task-data", "finetune", "{d}/ft_missing_data.toml",
        names="tasks.a.data"),
    cli("finetune-duplicate-task", "finetune", "{d}/ft_duplicate.toml", names="tasks.a.name"),
    cli("finetune-unknown-target-module", "finetune", "{d}/ft_bad_target.toml",
        names="tasks.a.target_modules"),
    cli("finetune-unknown-dtype", *FT, "--run.dtype=fp4", names="run.dtype"),
    cli("finetune-negative-lr", *FT, "--task_defaults.lr=-1", names="tasks.a.lr"),
    cli("finetune-negative-memory-budget", *FT, "--schedule.memory_budget_gb=-2",
        names="schedule.memory_budget_gb"),
    cli("finetune-unknown-base", *FT, "--base.preset=nope", names="base"),
    cli("finetune-missing-tokenizer", *FT, "--run.tokenizer={d}/missing.json",
        names="run.tokenizer"),
    cli("finetune-tasks-override", *FT, "--tasks.rank=2", names="tasks"),
    # cluster simulate / profile / run
    cli("cluster-missing-subcommand", "cluster", names="SUBCOMMAND"),
    cli("cluster-unknown-policy", *SIMULATE, "--policy", "nope", names="--policy"),
    cli("cluster-zero-jobs", *SIMULATE, "--jobs", "0", names="--jobs"),
    cli("cluster-zero-gpus", *SIMULATE, "--gpus", "0", names="--gpus"),
    cli("cluster-zero-per-node", *SIMULATE, "--per-node", "0", names="--per-node"),
    cli("cluster-negative-load", *SIMULATE, "--load", "-1", names="--load"),
    cli("cluster-negative-restart", *SIMULATE, "--restart-s", "-1", names="--restart-s"),
    cli("cluster-unknown-objective", *SIMULATE, "--objective", "fast", names="--objective"),
    cli("cluster-missing-trace", *SIMULATE, "--trace", "{d}/missing.csv", names="--trace"),
    cli("cluster-trace-wrong-columns", *SIMULATE, "--trace", "{d}/philly_wrong_columns.csv",
        names="--trace"),
    cli("cluster-jobs-file-syntax", *SIMULATE, "--jobs-file", "{d}/jobs_syntax.toml",
        names="malformed TOML"),
    cli("cluster-jobs-file-unknown-type", *SIMULATE, "--jobs-file", "{d}/jobs_unknown_type.toml",
        names="unknown job type"),
    cli("cluster-jobs-file-negative-workers", *SIMULATE,
        "--jobs-file", "{d}/jobs_negative_workers.toml", names="workers"),
    cli("cluster-jobs-file-unknown-key", *SIMULATE, "--jobs-file", "{d}/jobs_unknown_key.toml",
        names="foo"),
    cli("cluster-jobs-file-and-trace", *SIMULATE, "--jobs-file", "{d}/jobs_no_types.toml",
        "--trace", "{d}/philly_wrong_columns.csv", names="--jobs-file"),
    cli("cluster-colocation-not-json", *SIMULATE, "--colocation", "{d}/plain.txt",
        names="--colocation"),
    cli("cluster-unknown-gpu", *SIMULATE, "--gpu", "z100", names="--gpu"),
    cli("cluster-simulate-not-a-profile", *SIMULATE, "--profile", "{d}/empty",
        names="--profile"),
    cli("cluster-profile-zero-window", *PROFILE, "--window-s", "0", names="--window-s"),
    cli("cluster-profile-zero-cores", *PROFILE, "--cores-per-device", "0",
        names="--cores-per-device"),
    cli("cluster-profile-no-job-types", *PROFILE, names="[type.NAME]"),
    cli("cluster-run-not-a-profile", *RUN, "--profile", "{d}/empty", names="--profile"),
    cli("cluster-run-several-policies", *RUN, "--profile", "{d}/empty", "--policy", "all",
        names="--policy"),
    cli("cluster-run-missing-profile-flag", *RUN, names="--profile"),
    # serve
    cli("serve-port-out-of-range", "serve", "--port", "70000", names="--port"),
    cli("serve-non-numeric-port", "serve", "--port", "http", names="--port"),
    cli("serve-zero-block-size", *SERVE, "--block-size", "0", names="--block-size"),
    cli("serve-negative-num-blocks", *SERVE, "--num-blocks", "-5", names="--num-blocks"),
    cli("serve-zero-link", *SERVE, "--link-gbps", "0", names="--link-gbps"),
    cli("serve-bad-device-memory", *SERVE, "--device-memory", "lots", names="--device-memory"),
    cli("serve-negative-swap", *SERVE, "--swap-space", "-1", names="--swap-space"),
    cli("serve-unknown-policy", *SERVE, "--policy", "lru", names="--policy"),
    cli("serve-empty-api-key", *SERVE, "--api-key", "", names="--api-key"),
    cli("serve-bad-max-request-bytes", *SERVE, "--max-request-bytes", "huge",
        names="--max-request-bytes"),
    cli("serve-updating-without-root", *SERVE, "--enable-lora-updating", names="--lora-root"),
    cli("serve-root-without-updating", *SERVE, "--lora-root", "{d}/empty", names="--lora-root"),
    cli("serve-missing-lora-root", *SERVE, "--enable-lora-updating",
        "--lora-root", "{d}/no-such-root", names="--lora-root"),
    cli("serve-zero-replicas", *SERVE, "--replicas", "0", names="--replicas"),
    cli("serve-unknown-model", *SERVE, "--model", "nope", names="model 'nope'"),
    cli("serve-missing-adapter-folder", *SERVE, "--adapters", "{d}/no-adapter",
        names="--adapters"),
    cli("serve-missing-weights", *SERVE, "--weights", "{d}/missing.safetensors",
        names="--weights"),
    cli("serve-model-dir-not-a-run", *SERVE, "--model", "{d}/empty", names="--model"),
    cli("serve-missing-model-file", *SERVE, "--model", "{d}/missing.toml", names="--model"),
    cli("serve-missing-tokenizer", *SERVE, "--tokenizer", "{d}/missing.json",
        names="--tokenizer"),
    cli("serve-bpe-tokenizer", *SERVE, "--tokenizer", "bpe", names="--tokenizer"),
    cli("serve-zero-max-queue", *SERVE, "--max-queue", "0", names="--max-queue"),
    cli("serve-zero-adapters-per-replica", *SERVE, "--adapters-per-replica", "0",
        names="--adapters-per-replica"),
    cli("serve-negative-max-lora-rank", *SERVE, "--max-lora-rank", "-1",
        names="--max-lora-rank"),
    # generate
    cli("generate-missing-prompt", "generate", names="prompt"),
    cli("generate-negative-max-tokens", "generate", "hi", "--max-tokens", "-1",
        names="max_tokens"),
    cli("generate-temperature-out-of-range", "generate", "hi", "--temperature", "-1",
        names="temperature"),
    cli("generate-top-p-out-of-range", "generate", "hi", "--top-p", "2", names="top_p"),
    cli("generate-missing-adapter", "generate", "hi", "--adapter", "{d}/no-adapter",
        names="--adapter"),
    cli("generate-seed-too-large", "generate", "hi", "--seed", str(2**70), names="seed"),
    # bench serve
    cli("bench-missing-subcommand", "bench", names="SUBCOMMAND"),
    cli("bench-unreachable-server", *BENCH, names="--base-url"),
    cli("bench-bad-goodput", *BENCH, "--goodput", "ttft", names="--goodput"),
    cli("bench-unknown-model", *BENCH, "--model", "nope", names="--model", server=True),
    cli("bench-zero-prompts", *BENCH[:-1], "0", names="--num-prompts", server=True),
    cli("bench-bad-input-len", *BENCH, "--input-len", "8", names="--input-len", server=True),
    cli("bench-negative-request-rate", *BENCH, "--request-rate", "-2", names="--request-rate",
        server=True),
    cli("bench-too-many-adapters", *BENCH, "--num-adapters", "5", names="--num-adapters",
        server=True),
    cli("bench-trace-wrong-columns", *BENCH, "--trace", "{d}/azure_wrong_columns.csv",
        names="--trace", server=True),
]
# fmt: on

ERROR_LINE = re.compile(r"^legato(?: [\w-]+)*: error: ")


def _fake_server(url: str, **_: object) -> httpx.Response:
    """``/v1/models`` of a server with one base model and one adapter."""
    rows = [{"id": "tiny", "parent": None}, {"id": "lora-0", "parent": "tiny"}]
    return httpx.Response(200, json={"data": rows}, request=httpx.Request("GET", url))


def _server_started(*_: object, **__: object) -> None:
    raise AssertionError("the bad input was accepted: the server started")


@pytest.mark.parametrize(("argv", "names", "server"), CLI_CASES)
def test_cli_bad_input_is_one_error_line(argv, names, server, files, capsys, monkeypatch):
    monkeypatch.chdir(files)  # whatever a command would write lands in the module's folder
    monkeypatch.delenv("LEGATO_API_KEY", raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", _server_started)
    if server:
        monkeypatch.setattr(httpx, "get", _fake_server)
    try:
        code = main([arg.replace("{d}", str(files)) for arg in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 2, f"exit code {code}; stderr: {err!r}"
    lines = [line for line in err.splitlines() if line.strip()]
    if lines and lines[0].startswith("usage:"):  # argparse: usage (maybe wrapped), then error
        lines = [line for line in lines if not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), f"not one error line: {err!r}"
    assert names in lines[0], f"{names!r} not named in {lines[0]!r}"


# --- the HTTP cases ------------------------------------------------------------------------

API_KEY = "bad-inputs-key"
MAX_BODY = 64 * 2**10
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def http(case_id: str, path: str, status: int, param: str | None, *, method: str = "POST",
         fails: str = "", **request):  # fmt: skip
    """One bad request: ``request`` goes to the client (``json=``, ``content=``,
    ``headers=``; ``{root}`` in a string is the server's --lora-root); ``param``: the field
    the error object must name (None: the body as a whole)."""
    marks = [pytest.mark.xfail(strict=True, reason=fails)] if fails else []
    return pytest.param(method, path, request, status, param, id=case_id, marks=marks)


def completion(case_id: str, status: int, param: str | None, fails: str = "", **fields):
    body = {"model": "tiny", "prompt": "x", **fields}
    return http(case_id, "/v1/completions", status, param, json=body, fails=fails)


def chat(case_id: str, status: int, param: str | None, fails: str = "", **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    return http(case_id, "/v1/chat/completions", status, param, json=body, fails=fails)


# fmt: off
HTTP_CASES = [
    # any route: the body and the key
    http("not-json", "/v1/completions", 400, None, content=b"{not json"),
    http("not-utf8", "/v1/completions", 400, None, content=b'{"prompt": "\xff\xfe"}'),
    http("body-is-a-list", "/v1/completions", 400, "body", json=[1, 2]),
    http("body-too-large", "/v1/completions", 413, None,
         content=b'{"model": "tiny", "prompt": "' + b"x" * MAX_BODY + b'"}'),
    http("no-api-key", "/v1/models", 401, None, method="GET", headers={}),
    http("wrong-api-key", "/v1/completions", 401, None, json={"model": "tiny", "prompt": "x"},
         headers={"Authorization": "Bearer wrong"}),
    http("unknown-route", "/v1/embeddings", 404, None, json={}),
    http("wrong-method", "/v1/completions", 405, None, method="GET"),
    http("models-wrong-method", "/v1/models", 405, None),
    # /v1/completions
    http("missing-model", "/v1/completions", 400, "model", json={"prompt": "x"}),
    http("missing-prompt", "/v1/completions", 400, "prompt", json={"model": "tiny"}),
    completion("unknown-model", 404, "model", model="no-such-adapter"),
    completion("model-not-a-string", 400, "model", model=5),
    completion("prompt-not-text", 400, "prompt", prompt=5),
    completion("two-prompts", 400, "prompt", prompt=["a", "b"]),
    completion("empty-prompt", 400, "prompt", prompt=""),
    completion("token-id-outside-vocab", 400, "prompt", prompt=[999999]),
    completion("prompt-over-context", 400, "prompt", prompt="x" * 300, max_tokens=10),
    completion("negative-max-tokens", 400, "max_tokens", max_tokens=-1),
    completion("non-numeric-max-tokens", 400, "max_tokens", max_tokens="ten"),
    completion("fractional-max-tokens", 400, "max_tokens", max_tokens=1.5),
    completion("max-tokens-over-context", 400, "max_tokens", max_tokens=100_000),
    completion("negative-temperature", 400, "temperature", temperature=-0.5),
    completion("non-numeric-temperature", 400, "temperature", temperature="hot"),
    completion("zero-top-p", 400, "top_p", top_p=0),
    completion("negative-top-k", 400, "top_k", top_k=-5),
    completion("oversized-n", 400, "n", n=100),
    completion("five-stop-strings", 400, "stop", stop=["a", "b", "c", "d", "e"]),
    completion("empty-stop-string", 400, "stop", stop=[""]),
    completion("stream-not-a-bool", 400, "stream", stream="maybe"),
    completion("stream-yes", 400, "stream", stream="yes"),
    completion("stream-one", 400, "stream", stream=1),
    completion("ignore-eos-not-a-bool", 400, "ignore_eos", ignore_eos="true"),
    completion("stream-options-not-a-bool", 400, "stream_options.include_usage",
               stream_options={"include_usage": "maybe"}),
    completion("streamed-bad-temperature", 400, "temperature", stream=True, temperature=5),
    completion("seed-not-an-integer", 400, "seed", seed="s"),
    completion("seed-too-large", 400, "seed", seed=2**70),
    completion("seed-below-64-bits", 400, "seed", seed=-(2**63) - 1),
    http("nan-top-p", "/v1/completions", 400, "top_p",
         content=b'{"model": "tiny", "prompt": "x", "top_p": NaN}'),
    # /v1/chat/completions
    chat("empty-messages", 400, "messages", messages=[]),
    http("missing-messages", "/v1/chat/completions", 400, "messages", json={"model": "tiny"}),
    chat("messages-not-a-list", 400, "messages", messages="hi"),
    chat("unknown-role", 400, "messages.0.role", messages=[{"role": "wizard", "content": "x"}]),
    chat("message-without-content", 400, "messages.0.content", messages=[{"role": "user"}]),
    chat("chat-unknown-model", 404, "model", model="nope"),
    chat("chat-too-hot", 400, "temperature", temperature=3),
    chat("chat-n-2", 400, "n", n=2),
    chat("zero-max-completion-tokens", 400, "max_completion_tokens", max_completion_tokens=0),
    chat("max-completion-tokens-over-context", 400, "max_completion_tokens",
         max_completion_tokens=100_000),
    http("chat-not-json", "/v1/chat/completions", 400, None, content=b"[[["),
    # /v1/load_lora_adapter, /v1/unload_lora_adapter
    http("load-missing-path", LOAD, 400, "lora_path", json={"lora_name": "x"}),
    http("load-path-not-a-string", LOAD, 400, "lora_path",
         json={"lora_name": "x", "lora_path": 7}),
    http("load-name-not-a-string", LOAD, 400, "lora_name",
         json={"lora_name": 3, "lora_path": "{root}"}),
    http("load-outside-lora-root", LOAD, 400, "lora_path",
         json={"lora_name": "x", "lora_path": "/etc"}),
    http("load-dotdot-escape", LOAD, 400, "lora_path",
         json={"lora_name": "x", "lora_path": "{root}/../elsewhere"}),
    http("load-missing-folder", LOAD, 400, "lora_path",
         json={"lora_name": "x", "lora_path": "{root}/none"}),
    http("load-base-model-name", LOAD, 400, "lora_name",
         json={"lora_name": "tiny", "lora_path": "{root}"}),
    http("load-empty-name", LOAD, 400, "lora_name",
         json={"lora_name": "", "lora_path": "{root}"}),
    http("load-not-json", LOAD, 400, None, content=b"nope"),
    http("unload-missing-name", UNLOAD, 400, "lora_name", json={}),
    http("unload-empty-name", UNLOAD, 400, "lora_name", json={"lora_name": ""}),
    http("unload-unknown-adapter", UNLOAD, 404, "lora_name", json={"lora_name": "never-loaded"}),
    http("unload-base-model", UNLOAD, 404, "lora_name", json={"lora_name": "tiny"}),
    # /health, /metrics
    http("health-wrong-method", "/health", 405, None),
    http("metrics-wrong-method", "/metrics", 405, None),
]
# fmt: on


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora-root")


@pytest.fixture(scope="module")
def client(lora_root):
    """One app over the tiny model and two generated adapters, behind an API key, a small
    body limit and runtime adapter loading from under ``lora_root``."""
    from legato.serve.access import Access
    from legato.serve.engine import Engine, EngineConfig
    from legato.serve.loading import generated_adapters, load_served_model
    from legato.serve.server import create_app

    model, tokenizer, name = load_served_model("tiny")
    adapters = generated_adapters(model, count=2, rank=4)
    config = EngineConfig(block_size=8, num_blocks=96, max_queue=4)
    engine = Engine(model, tokenizer, adapters, config, model_name=name)
    access = Access(API_KEY, MAX_BODY, lora_updating=True, lora_roots=(lora_root,))
    with TestClient(create_app(engine, access=access), raise_server_exceptions=False) as test:
        yield test


def _with_root(value, root: Path):
    if isinstance(value, dict):
        return {key: _with_root(item, root) for key, item in value.items()}
    return value.replace("{root}", str(root)) if isinstance(value, str) else value


@pytest.mark.parametrize(("method", "path", "request_", "status", "param"), HTTP_CASES)
def test_http_bad_input_is_an_openai_error(method, path, request_, status, param, client,
                                           lora_root):  # fmt: skip
    request_ = {key: _with_root(value, lora_root) for key, value in request_.items()}
    headers = request_.pop("headers", {"Authorization": f"Bearer {API_KEY}"})
    if "content" in request_:
        headers = {**headers, "Content-Type": "application/json"}
    reply = client.request(method, path, headers=headers, **request_)
    assert "Traceback" not in reply.text
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["code"] == status and isinstance(error["type"], str) and error["type"]
    assert isinstance(error["message"], str) and error["message"].strip()
    assert "\n" not in error["message"], error["message"]
    if param is None:
        assert error["param"] in (None, "body"), error
    else:  # pydantic may name the branch of a union it tried (``prompt.str``)
        assert error["param"] == param or str(error["param"]).startswith(param + "."), error
        assert param in error["message"], error  # the message names it too


# --- the table itself ----------------------------------------------------------------------


def test_at_least_fifty_distinct_bad_inputs_over_every_command_and_endpoint():
    ids = [case.id for case in CLI_CASES + HTTP_CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 50
    commands = {case.values[0][0] for case in CLI_CASES if case.values[0]}
    assert commands >= {"models", "hardware", "predict", "plan", "calibrate", "train", "eval",
                        "export", "schedule", "finetune", "cluster", "serve", "generate",
                        "bench"}  # fmt: skip
    paths = {case.values[1] for case in HTTP_CASES}
    assert paths >= {"/v1/completions", "/v1/chat/completions", "/v1/models", LOAD, UNLOAD}
