"""Fused multi-task LoRA over 2 gloo processes equals the 1-process run.

One spawn of 2 processes trains 3 tasks of different ranks and sequence lengths with two
fused groups per step (so every step issues overlapping asynchronous all-reduces); the
parent trains the same tasks on one process, with one group and a different fused-step
split, and compares per-task losses and adapter weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gloo_harness import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lora"))  # tests has no packages
from lora_fixtures import SPEC, synthetic_stream, task

from legato.lora import MultiLoraModel, MultiTaskTrainer, PackingScheduler
from legato.lora.config import load_finetune_config
from legato.lora.data_parallel import DataParallel
from legato.lora.runner import finetune
from legato.models import build_model

pytestmark = pytest.mark.distributed

# Two ranks sum their gradient shares in another order than one process: fp32 rounding in
# the last bits, growing a little over AdamW steps; far below any real bug (a wrong share
# or normaliser moves losses by 1e-2 and weights by the learning rate, 1e-2).
TOLERANCE = 1e-5

TASKS = [
    task("a", rank=2, batch_size=4, seq_len=16),
    task("b", rank=4, batch_size=6, seq_len=8, lr=5e-3),
    task("c", rank=8, batch_size=4, seq_len=16, steps=4, warmup_steps=1),
]


def _train(dp: DataParallel | None, max_tokens: int) -> dict[str, object]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MultiLoraModel(build_model(SPEC, seed=0))
    trainer = MultiTaskTrainer(model, PackingScheduler(max_tokens), data_parallel=dp)
    for i, cfg in enumerate(TASKS):
        trainer.add_task(cfg, synthetic_stream(i + 1))
    trainer.run()
    return {
        "losses": {n: [r.loss for r in h] for n, h in trainer.history.items()},
        "weights": {n: a.state_dict() for n, a in trainer.finished.items()},
        "fused_steps": trainer.fused_steps,
    }


def _worker(rank: int) -> dict[str, object]:
    dp = DataParallel(fused_groups=2)
    calls: list[int] = []
    reduce_async = dp.reduce_async
    dp.reduce_async = lambda tensors: calls.append(len(tensors)) or reduce_async(tensors)
    result = _train(dp, max_tokens=48)  # batches split over fused steps
    result["reduces"] = len(calls)
    return result


def test_two_processes_match_one_process() -> None:
    ranks = run_ranks(_worker)
    one = _train(None, max_tokens=128)
    assert ranks[1]["reduces"] > ranks[0]["fused_steps"]  # several groups per step
    for got in ranks:
        for name, want in one["losses"].items():
            assert len(got["losses"][name]) == len(want)
            assert got["losses"][name] == pytest.approx(want, abs=TOLERANCE, rel=0)
        for name, want in one["weights"].items():
            for key, value in want.items():
                torch.testing.assert_close(got["weights"][name][key], value, atol=TOLERANCE, rtol=0)
    trained_b = [v for k, v in one["weights"]["c"].items() if k.startswith("lora_B")]
    assert trained_b and all(v.abs().sum() > 0 for v in trained_b)  # B starts at zero


def test_groups_cover_the_step_in_an_overlap_order() -> None:
    dp = DataParallel(fused_groups=2)
    groups = dp.groups([64, 32, 32, 64], [100, 400, 100, 100])
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3] and len(groups) == 2
    assert DataParallel(fused_groups=3).groups([64], [10]) == [[0]]


FINETUNE_TOML = """
[base]
preset = "tiny"
overrides = {hidden_size = 32, num_layers = 1, num_heads = 2, ffn_hidden_size = 64, vocab_size = 258, seq_len = 64}
[run]
device = "cpu"
[schedule]
max_tokens_per_step = 256
profile = false
[task_defaults]
steps = 3
batch_size = 4
seq_len = 32
rank = 2
[[tasks]]
name = "sums"
data = "sums.jsonl"
"""


def _step_losses(output: Path) -> list[float]:
    return [
        json.loads(line)["loss"] for line in (output / "metrics.jsonl").read_text().splitlines()
    ]


def test_finetune_command_launches_run_nproc_processes(tmp_path: Path) -> None:
    """``legato finetune --run.nproc=2`` starts 2 data-parallel workers itself: the same
    losses as one process, one adapter and one report line (rank 0's)."""
    lines = [{"prompt": f"{i}+{i}=", "response": str(2 * i)} for i in range(60)]
    (tmp_path / "sums.jsonl").write_text("\n".join(map(json.dumps, lines)), encoding="utf-8")
    config = tmp_path / "finetune.toml"
    config.write_text(FINETUNE_TOML, encoding="utf-8")
    two = tmp_path / "two"
    command = [sys.executable, "-m", "legato.cli.main", "finetune", str(config)]
    proc = subprocess.run(
        [*command, "--run.nproc=2", f"--run.output_dir={two}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"sums: {two / 'sums'}") == 1
    assert (two / "sums" / "adapter_model.safetensors").is_file()
    finetune(load_finetune_config(config, [f"--run.output_dir={tmp_path / 'one'}"]))
    want = _step_losses(tmp_path / "one")
    assert len(want) == 3
    assert _step_losses(two) == pytest.approx(want, abs=TOLERANCE, rel=0)
