"""Every family of the 7-D runtime equals one process: losses, every gradient, every norm.

Each row is a strategy string as ``legato plan`` prints it, trained by ``Trainer`` on real
gloo processes (2, or 4 and 8 where the composition needs them) for three steps without clipping.
Against the same three steps in one process: the loss and the gradient norm of every step,
and every parameter's full gradient at the first step (DTensor shards gathered, pipeline
stages merged), within 1e-5 relative. A layout that scaled every gradient by a constant
would pass a loss check after AdamW but fails the gradient and norm checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_gradients import assert_same_gradients, first_step_gradients

from gloo_harness import run_ranks

pytestmark = pytest.mark.distributed

STEPS = 3
RTOL = 1e-5  # fp32; two layouts differ in reduction order only (seen: < 1e-6)
# Heads and KV heads divisible by 2 (tp), 3 layers (an uneven pp=2 split), a vocabulary
# of 259 that tp=2 does not divide (split 130/129), 64 tokens (cp=2 cuts 4 chunks).
DENSE = (
    "{num_layers = 3, hidden_size = 64, num_heads = 2, num_kv_heads = 2, "
    "ffn_hidden_size = 128, vocab_size = 259, seq_len = 64}"
)
MOE = "{num_layers = 2, hidden_size = 64, num_heads = 2, num_kv_heads = 2, vocab_size = 259}"
# 4 layers (pp=2 x vpp=2), the embedding tied to the LM head: a copy on the first and the
# last stage, each FSDP2-sharded over its own data-parallel group
TIED = DENSE.replace("num_layers = 3", "num_layers = 4").replace("}", ", tied_embeddings = true}")
MODELS = {"dense": ("tiny", DENSE), "tied": ("tiny", TIED), "moe": ("tiny-moe", MOE)}
# row id -> (model, world size, strategy)
ROWS = {
    "zero=0": ("dense", 2, "zero=0"),
    "zero=1": ("dense", 2, "zero=1"),
    "zero=2": ("dense", 2, "zero=2"),
    "zero=3": ("dense", 2, "zero=3"),
    "recompute=selective": ("dense", 2, "recompute=selective"),
    "recompute=full": ("dense", 2, "recompute=full"),
    "tp=2": ("dense", 2, "tp=2"),
    "tp=2,sp": ("dense", 2, "tp=2,sp=1"),
    "cp=2": ("dense", 2, "cp=2"),
    "pp=2 uneven": ("dense", 2, "pp=2,schedule=1f1b"),
    "pp=2 recompute=full": ("dense", 2, "pp=2,recompute=full"),
    "pp=2 zb-h1 recompute=selective": ("dense", 2, "pp=2,schedule=zb-h1,recompute=selective"),
    "pp=2 zb-h1 swap": ("dense", 2, "pp=2,schedule=zb-h1,swap=1"),
    "moe ep=2": ("moe", 2, "ep=2"),
    "moe pp=2 zb-h1": ("moe", 2, "pp=2,schedule=zb-h1"),
    "tp=2 x dp=2": ("dense", 4, "tp=2,dp=2,zero=3"),
    "tp=2 x cp=2": ("dense", 4, "tp=2,cp=2,zero=3"),
    "pp=2 x dp=2 zero=1": ("dense", 4, "pp=2,zero=1"),
    "pp=2 x dp=2 zero=3 zb-h1": ("dense", 4, "pp=2,zero=3,schedule=zb-h1,recompute=selective"),
    "pp=2 x dp=2 zero=2 tied loss_chunk": (
        "tied",
        4,
        "pp=2,zero=2,schedule=interleaved,vpp=2,loss_chunk=16",
    ),
    "moe pp=2 x ep=2 zero=1": ("moe", 4, "pp=2,ep=2,zero=1"),
    "pp=2 x tp=2 zb-h1": ("dense", 4, "pp=2,tp=2,schedule=zb-h1"),
    "pp=2 x cp=2 zero=1": ("dense", 4, "pp=2,cp=2,zero=1"),
    "pp=2 x tp=2 sp svpp": ("dense", 4, "pp=2,tp=2,sp=1,schedule=svpp,slices=2"),
    "pp=2 x tp=2 sp x dp=2 zero=1": ("dense", 8, "pp=2,tp=2,sp=1,dp=2,zero=1"),
    "tp=2x2 sp": ("dense", 4, "tp=2x2,sp=1"),
    "pp=2 x tp=2x2 zb-h1": ("dense", 8, "pp=2,tp=2x2,schedule=zb-h1"),
}


def _args(small_train_args, run: Path, model: str, *extra: str) -> list[str]:
    preset, overrides = MODELS[model]
    return small_train_args(
        run,
        f"--model.preset={preset}",
        f"--model.overrides={overrides}",
        "--train.micro_batch_size=2",
        *extra,
    )


def _train_rows(rank: int, rows: dict[str, list[str]]) -> dict[str, tuple[dict, dict]]:
    """A ``run_ranks`` worker: every row's first-step gradients on this rank, and the
    share of each gradient the rank holds."""
    out = {}
    for name, args in rows.items():
        shares: dict[str, float] = {}
        out[name] = (first_step_gradients(args, STEPS, shares), shares)
    return out


def _log(run: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records], [r["grad_norm"] for r in records]


@pytest.fixture(scope="module")
def runs(small_train_args, tmp_path_factory: pytest.TempPathFactory):
    """``runs(row)``: (one process: grads, losses, norms), (ranks' grads, losses, norms),
    shares. Each world size is launched once, for all its rows, when a test first asks for
    one of them: a selection without the 4- and 8-process rows (``-m "not slow"``) never
    starts those oversubscribed launches."""
    root = tmp_path_factory.mktemp("strategies")
    one: dict[str, tuple] = {}
    out: dict[str, tuple] = {}

    def reference(model: str) -> tuple:
        if model not in one:
            run = root / "one" / model
            args = _args(small_train_args, run, model, "--parallel.nproc=1")
            one[model] = (first_step_gradients(args, STEPS), *_log(run))
        return one[model]

    def get(row: str) -> tuple:
        if row not in out:
            world = ROWS[row][1]
            rows = {
                name: _args(small_train_args, root / name, model, f"--parallel.strategy={text}")
                for name, (model, size, text) in ROWS.items()
                if size == world
            }
            ranks = run_ranks(_train_rows, rows, world_size=world, timeout_s=240)
            for name in rows:
                got = ([r[name][0] for r in ranks], *_log(root / name))
                out[name] = (reference(ROWS[name][0]), got, [r[name][1] for r in ranks])
        return out[row]

    return get


def _rows(keep=lambda text: True) -> list:
    """The rows as parameters; those on more than 2 processes (oversubscribed on a 2-core
    machine) are ``slow``: ``make test-slow`` runs them, ``make test`` does not."""
    return [
        pytest.param(name, marks=pytest.mark.slow) if size > 2 else name
        for name, (_, size, text) in ROWS.items()
        if keep(text)
    ]


@pytest.mark.parametrize("row", _rows())
def test_strategy_equals_one_process(row: str, runs) -> None:
    (want_grads, want_losses, want_norms), (grads, losses, norms), _ = runs(row)
    assert losses == pytest.approx(want_losses, rel=RTOL)
    assert norms == pytest.approx(want_norms, rel=RTOL)
    assert_same_gradients(grads, want_grads, RTOL)


@pytest.mark.parametrize("row", _rows(lambda text: "zero=" in text))
def test_zero_shards_what_it_says(row: str, runs) -> None:
    """ZeRO >= 1 leaves each rank about half of every gradient (two data-parallel ranks);
    zero=0 (DDP, the pipeline's all-reduce) every gradient whole."""
    shares = [share for rank in runs(row)[2] for share in rank.values()]
    if "zero=0" in ROWS[row][2]:
        assert set(shares) == {1.0}
    else:
        assert max(shares) <= 0.51, max(shares)
