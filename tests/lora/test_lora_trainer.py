"""Tasks join and leave while others train; per-task schedules; the CLI end to end."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_fixtures import SPEC, synthetic_stream, task

from legato.cli import finetune as finetune_cli
from legato.errors import ConfigError
from legato.lora import MultiLoraModel, MultiTaskTrainer, PackingScheduler, TaskStream, load_adapter
from legato.lora.progress import TaskProgress
from legato.lora.trainer import TaskStepRecord
from legato.models import build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _trainer(tmp_path=None, **kwargs):
    model = MultiLoraModel(build_model(SPEC, seed=0))
    return MultiTaskTrainer(model, PackingScheduler(4096), output_dir=tmp_path, **kwargs)


def test_tasks_join_late_and_leave_early_while_others_run(tmp_path):
    fused: list[tuple[str, ...]] = []
    trainer = _trainer(tmp_path)
    trainer.add_task(task("long", steps=6), synthetic_stream(1))
    trainer.add_task(task("short", steps=2), synthetic_stream(2))
    trainer.add_task(task("late", steps=2, join_at=3), synthetic_stream(3))
    while not trainer.done:
        trainer.step()
        fused.append(tuple(sorted(trainer.runs)))
    assert trainer.fused_steps == 6
    assert "short" not in fused[2] and "late" in fused[3]  # short left, late joined
    assert [len(trainer.history[n]) for n in ("long", "short", "late")] == [6, 2, 2]
    for name in ("long", "short", "late"):
        adapter = load_adapter(tmp_path / name, trainer.model.base)
        for (_, a, b), (_, a2, b2) in zip(
            adapter.named_factors(), trainer.finished[name].named_factors(), strict=True
        ):
            assert torch.equal(a, a2) and torch.equal(b, b2)


def test_a_task_added_and_removed_mid_run_leaves_the_others_alone(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.add_task(task("a", steps=4), synthetic_stream(1))
    trainer.step()
    trainer.add_task(task("b", steps=4), synthetic_stream(2))
    with pytest.raises(ConfigError, match=r"tasks\.c\.target_modules"):
        trainer.add_task(task("c", target_modules=["nope"]), synthetic_stream(3))
    with pytest.raises(ConfigError, match=r"tasks\.a\.name: a task named 'a' already exists"):
        trainer.add_task(task("a"), synthetic_stream(3))
    trainer.step()
    trainer.remove_task("b")
    trainer.run()
    assert list(trainer.finished) == ["a"]
    assert [r.step for r in trainer.history["a"]] == [1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_each_task_follows_its_own_learning_rate_schedule():
    trainer = _trainer()
    trainer.add_task(
        task("warm", lr=1e-2, warmup_steps=2, steps=4, min_lr_ratio=0.5), synthetic_stream(1)
    )
    trainer.add_task(task("flat", lr=3e-3, steps=4, min_lr_ratio=1.0), synthetic_stream(2))
    trainer.run()
    assert [r.lr for r in trainer.history["warm"]] == pytest.approx([5e-3, 1e-2, 7.5e-3, 5e-3])
    assert [r.lr for r in trainer.history["flat"]] == pytest.approx([3e-3] * 4)


def test_losses_fall_on_learnable_data():
    pattern = np.tile(np.arange(7) * 5, 200)  # a repeating sequence the adapter can learn
    stream = TaskStream(
        pattern, np.ones(len(pattern), dtype=bool), np.zeros(len(pattern), dtype=np.int64)
    )
    trainer = _trainer()
    trainer.add_task(
        task("t", steps=12, lr=3e-2, rank=8, target_modules=["lm_head", "down_proj"]), stream
    )
    trainer.run()
    losses = [r.loss for r in trainer.history["t"]]
    assert losses[-1] < 0.25 * losses[0]


def test_cli_trains_the_example_config(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    finetune_cli.register(parser.add_subparsers())
    small = (
        "{hidden_size = 32, num_layers = 1, num_heads = 2, ffn_hidden_size = 64, vocab_size = 258}"
    )
    args, extra = parser.parse_known_args(
        [
            "finetune",
            str(EXAMPLES / "finetune.toml"),
            f"--base.overrides={small}",
            f"--run.output_dir={tmp_path}",
            "--run.device=cpu",
            "--schedule.memory_budget_gb=0.05",
        ]
    )
    assert args.func(args, extra) == 0
    out = capsys.readouterr().out
    assert "[add] step 40/40" in out and "[stories] done: adapter saved to" in out
    for name in ("reverse", "upper", "add", "stories"):
        assert (tmp_path / name / "adapter_model.safetensors").is_file()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["task"] == "stories" for r in records) == 20


def test_progress_is_a_bar_per_task_on_a_terminal_and_lines_otherwise():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    record = TaskStepRecord("sql", 1, 5, 2.5, 1e-3, 512, 0.1)
    tty = Terminal()
    bars = TaskProgress(10, tty)
    bars.add("sql", 5)
    bars.add("chat", 3)
    bars.update(record)
    bars.close()
    assert "sql" in tty.getvalue() and "1/5" in tty.getvalue() and "0/3" in tty.getvalue()
    plain = io.StringIO()
    lines = TaskProgress(10, plain)
    lines.update(record)
    lines.update(TaskStepRecord("sql", 2, 5, 2.4, 1e-3, 512, 0.1))  # thinned out
    lines.finish("sql", Path("out/sql"))
    assert plain.getvalue().splitlines() == [
        "[sql] step 1/5  loss 2.5000  lr 1.00e-03  5,120 tok/s",
        "[sql] done: adapter saved to out/sql",
    ]
