"""``train.compile``: compiled blocks train as eager ones do, on CPU in one process.

The test compiles with ``aot_eager``: the same dynamo trace and AOTAutograd forward and
backward graphs as inductor, run by eager kernels, so it takes seconds instead of the
minute inductor's C++ kernels take to build on a CI core. What it checks (the compiled
path computes the eager model's losses and gradients, the parameters keep their names)
does not depend on the kernels.
"""

from __future__ import annotations

import json
import re
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


@pytest.mark.parametrize(
    ("preset", "strategy"), [("tiny", ""), ("tiny", "recompute=full"), ("tiny-moe", "")]
)
def test_compiled_blocks_train_as_eager(
    small_train_args, tmp_path: Path, preset: str, strategy: str
) -> None:
    """Dense and MoE blocks (whose routed experts run eagerly inside the compiled block)."""
    knobs = (f"--model.preset={preset}",)
    knobs += (f"--parallel.strategy={strategy}",) if strategy else ()
    _, eager = _run(small_train_args, tmp_path / "eager", *knobs)
    compiled_args = ("--train.compile=true", "--train.compile_backend=aot_eager", *knobs)
    trainer, compiled = _run(small_train_args, tmp_path / "compiled", *compiled_args)
    blocks = trainer.model.blocks
    assert all(hasattr(b.forward, "_torchdynamo_orig_callable") for b in blocks)
    assert not any("_orig_mod" in name for name, _ in trainer.model.named_parameters())
    for want, got in zip(eager, compiled, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=RTOL)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=RTOL)


@pytest.mark.parametrize(
    ("strategy", "message"),
    [("pp=2", "pp=2 (the pipeline runner"), ("tp=2", "tp=2 with sp=0 (dynamo's graph")],
)
def test_a_strategy_that_cannot_compile_is_one_line(
    small_train_args, tmp_path: Path, strategy: str, message: str
) -> None:
    args = small_train_args(
        tmp_path / "run", f"--parallel.strategy={strategy}", "--train.compile=true",
        "--model.overrides={num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2}",
    )  # fmt: skip
    config = load_config(None, args)
    with pytest.raises(
        ConfigError, match=rf"^train.compile: cannot compile under {re.escape(message)}"
    ):
        config.job(resolve_model(config.model), 2)
