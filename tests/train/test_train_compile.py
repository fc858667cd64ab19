"""``train.compile``: compiled blocks train as eager ones do, on CPU in one process.

The test compiles with ``aot_eager``: the same dynamo trace and AOTAutograd forward and
backward graphs as inductor, run by eager kernels, so it takes seconds instead of the
minute inductor's C++ kernels take to build on a CI core. What it checks (the compiled
path computes the eager model's losses and gradients, the parameters keep their names)
does not depend on the kernels.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legato.errors import ConfigError
from legato.train.config import load_config, resolve_model
from legato.train.trainer import Trainer

# aot_eager reorders nothing the eager kernels round (seen: equal to the last bit on losses,
# 3e-9 on gradients); 1e-6 still fails any missed or doubled term
RTOL = 1e-6


def _run(small_train_args, run: Path, *extra: str) -> tuple[Trainer, list[dict]]:
    args = small_train_args(run, "--parallel.nproc=1", "--train.steps=3", *extra)
    trainer = Trainer(load_config(None, args))
    trainer.fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return trainer, records


@pytest.mark.parametrize("strategy", ["", "recompute=full"])
def test_compiled_blocks_train_as_eager(small_train_args, tmp_path: Path, strategy: str) -> None:
    knobs = (f"--parallel.strategy={strategy}",) if strategy else ()
    _, eager = _run(small_train_args, tmp_path / "eager", *knobs)
    compiled_args = ("--train.compile=true", "--train.compile_backend=aot_eager", *knobs)
    trainer, compiled = _run(small_train_args, tmp_path / "compiled", *compiled_args)
    blocks = trainer.model.blocks
    assert all(hasattr(b.forward, "_torchdynamo_orig_callable") for b in blocks)
    assert not any("_orig_mod" in name for name, _ in trainer.model.named_parameters())
    for want, got in zip(eager, compiled, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=RTOL)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=RTOL)


def test_a_strategy_that_cannot_compile_is_one_line(small_train_args, tmp_path: Path) -> None:
    args = small_train_args(tmp_path / "run", "--parallel.strategy=pp=2", "--train.compile=true")
    with pytest.raises(ConfigError, match=r"^train.compile: cannot compile under pp=2 \(the pipe"):
        load_config(None, args).job(resolve_model(load_config(None, args).model), 2)
