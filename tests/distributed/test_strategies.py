"""Every priced strategy key on every model family equals one process: losses, every
gradient, every norm.

The 2-process rows are derived, not listed: ``coverage_rows`` merges every example of the
priced keys' table (``specs.priced_keys``) that a family can take into as few strategy
strings as the runtime accepts, one launch per family -- dense GQA (``tiny``), tied
embeddings with biases, LayerNorm and learned positions (``tiny-gpt``), MoE
(``tiny-moe``), MLA + MoE with a shared expert (``tiny-deepseek``) -- and to them the top
``PLANS`` plans ``legato plan`` ranks for the family's model on this machine's cluster
(``local-cpu``, 2 processes, priced in fp32 as the rows train): what the planner would
tell a user to run must run. The 4- and 8-process rows (``slow``) are compositions that
need more ranks than two.

Each row is trained by ``Trainer`` on real gloo processes for three steps without
clipping. Against the same three steps in one process: the loss and the gradient norm of
every step, and every parameter's full gradient at the first step (DTensor shards
gathered, pipeline stages merged), within 1e-5 relative. A layout that scaled every
gradient by a constant would pass a loss check after AdamW but fails the gradient and
norm checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_gradients import assert_same_gradients, first_step_gradients

from coverage_rows import coverage_rows
from gloo_harness import run_ranks
from legato.errors import LegatoError
from legato.plan import SearchSpace, make_plan
from legato.specs.registry import load_cluster
from legato.specs.strategy import Strategy
from legato.train.config import load_config, resolve_model

pytestmark = pytest.mark.distributed

STEPS = 3
RTOL = 1e-5  # fp32; two layouts differ in reduction order only (seen: < 1e-6)
# Heads and KV heads divisible by 2 (tp), 4 layers (pp=2 x vpp=2; 3 for an uneven pp=2
# split), a vocabulary of 259 that tp=2 does not divide (split 130/129), 64 tokens (cp=2
# cuts 4 chunks).
SMALL = "hidden_size = 64, num_heads = 2, num_kv_heads = 2, vocab_size = 259, seq_len = 64"
DENSE = f"{{num_layers = 3, {SMALL}, ffn_hidden_size = 128}}"
# the embedding tied to the LM head: a copy on the first and the last stage, each
# FSDP2-sharded over its own data-parallel group
TIED = DENSE.replace("num_layers = 3", "num_layers = 4").replace("}", ", tied_embeddings = true}")
FOUR = f"{{num_layers = 4, {SMALL}}}"
MODELS = {
    "dense": ("tiny", DENSE.replace("num_layers = 3", "num_layers = 4")),
    "uneven": ("tiny", DENSE),
    "tied": ("tiny", TIED),
    "gpt": ("tiny-gpt", FOUR.replace("}", ", ffn_hidden_size = 128}")),
    "moe": ("tiny-moe", FOUR),
    "deepseek": ("tiny-deepseek", FOUR),
}
FAMILIES = {"dense": False, "gpt": False, "moe": True, "deepseek": True}  # name -> is MoE
BATCH = ("--train.global_batch_size=8", "--train.micro_batch_size=2")
# The MoE load-balance loss is a statistic of the tokens one forward sees: cp and sequence
# slices see a part of each sequence, so it differs from one process's by design (as the
# router's own per-rank balance does in Megatron); the rows compare the model's gradients.
AUX_OFF = ("--train.moe_aux_loss_coef=0",)


PLANS = 3  # the planner's top plans per family that must run


def _config(model: str, *extra: str):
    preset, overrides = MODELS[model]
    args = [f"--model.preset={preset}", f"--model.overrides={overrides}", *BATCH, *extra]
    return load_config(None, args)


def _fits(model: str):
    """Whether ``legato train`` resolves a strategy for ``model`` on 2 processes."""

    def fits(text: str) -> bool:
        try:
            config = _config(model, f"--parallel.strategy={text}")
            config.job(resolve_model(config.model), 2)
        except LegatoError:
            return False
        return True

    return fits


def planned(model: str) -> list[str]:
    """The strategies of the top ``PLANS`` plans of ``legato plan`` for ``model`` on the
    local CPU cluster of 2 processes, at the rows' global batch, in fp32."""
    config = _config(model)
    cluster = load_cluster("local-cpu", nodes=1)
    report = make_plan(resolve_model(config.model), cluster, config.train.global_batch_size,
                       top_k=PLANS, space=SearchSpace(dtype="fp32"))  # fmt: skip
    return [scored.strategy.to_string() for scored in report.result.ranked]


# row id -> (model, world size, strategy)
ROWS = {
    f"{family} {text}": (family, 2, text)
    for family, moe in FAMILIES.items()
    for text in coverage_rows(_fits(family), moe)[0]
}
ROWS |= {
    f"{family} plan #{rank} {text}": (family, 2, text)
    for family in FAMILIES
    for rank, text in enumerate(planned(family), 1)
}
ROWS |= {
    "pp=2 uneven": ("uneven", 2, "pp=2,schedule=1f1b"),
    # the chunked loss on a vocabulary-parallel tied head, hidden states sequence-split
    "gpt tp=2 sp loss_chunk": ("gpt", 2, "tp=2,sp=1,loss_chunk=16"),
    # activation swap of blocks whose saved activations are DTensors (sp) or shards (whole
    # micro-batches: a tp shard of two sequences is below the swap's 64 KiB floor)
    "tp=2 sp swap": ("dense", 2, "tp=2,sp=1,swap=1,mbs=8"),
    "moe tp=2 swap": ("moe", 2, "tp=2,swap=1,mbs=8"),
    # tp of MLA and the shared expert on the gathered tokens (the folded-EP row's
    # coverage row shares tp=2,sp=1 with the experts; this one replicates them over tp)
    "deepseek tp=2 sp": ("deepseek", 2, "tp=2,sp=1"),
    # every expert's FFN split over tp, the layer's partial sum all-reduced (no sp)
    "moe tp=2 etp=2": ("moe", 2, "tp=2,etp=2"),
    "tp=2 x dp=2": ("dense", 4, "tp=2,dp=2,zero=3"),
    # ZeRO-0 where DDP cannot wrap: the step averages the gradients after the backward
    "tp=2 x dp=2 zero=0": ("dense", 4, "tp=2,dp=2,zero=0"),
    "moe pp=2 x ep=2 zero=0": ("moe", 4, "pp=2,ep=2,zero=0"),
    "tp=2 x dp=2 zero=1 loss_chunk": ("dense", 4, "tp=2,dp=2,zero=1,loss_chunk=16"),
    "tp=2 x cp=2": ("dense", 4, "tp=2,cp=2,zero=3"),
    "pp=2 x dp=2 zero=1": ("dense", 4, "pp=2,zero=1"),
    "pp=2 x dp=2 zero=3 zb-h1": ("dense", 4, "pp=2,zero=3,schedule=zb-h1,recompute=selective"),
    "pp=2 x dp=2 zero=2 tied loss_chunk": (
        "tied",
        4,
        "pp=2,zero=2,schedule=interleaved,vpp=2,loss_chunk=16",
    ),
    "moe pp=2 x ep=2 zero=1": ("moe", 4, "pp=2,ep=2,zero=1"),
    "moe tp=2 x ep=2 sp": ("moe", 4, "tp=2,dp=2,ep=2,sp=1,zero=2"),
    "deepseek tp=2 x ep=2": ("deepseek", 4, "tp=2,dp=2,ep=2,zero=3"),
    # ep folded over tp and dp: every rank dispatches its own sequence shard to 4 experts
    "moe tp=2 x dp=2 ep=4 folded": ("moe", 4, "tp=2,dp=2,ep=4,sp=1,zero=1"),
    # each expert on 2 of the 4 data-parallel ranks, its gradient summed over the two
    "moe dp=4 ep=2": ("moe", 4, "dp=4,ep=2,zero=2"),
    # experts on the 2-D (ep, etp) mesh: rows over the dp ranks, FFN width over tp
    "moe tp=2 x dp=2 ep=2 etp=2": ("moe", 4, "tp=2,dp=2,ep=2,etp=2,zero=1"),
    "deepseek tp=2 x dp=2 ep=2 etp=2 sp": ("deepseek", 4, "tp=2,dp=2,ep=2,etp=2,sp=1,zero=3"),
    "deepseek pp=2 x tp=2 ep=2 folded": ("deepseek", 4, "pp=2,tp=2,ep=2,sp=1"),
    "gpt pp=2 x tp=2 sp": ("gpt", 4, "pp=2,tp=2,sp=1"),
    "pp=2 x tp=2 zb-h1": ("dense", 4, "pp=2,tp=2,schedule=zb-h1"),
    "pp=2 x cp=2 zero=1": ("dense", 4, "pp=2,cp=2,zero=1"),
    # each sequence slice split over cp as a sequence of its own, its K/V gathered and
    # cached whole for the later slices (the planner's favourite at GPU scale)
    "pp=2 x cp=2 seq1f1b slices=2": ("dense", 4, "pp=2,cp=2,zero=1,schedule=seq1f1b,slices=2"),
    "moe pp=2 x cp=2 svpp slices=2": ("moe", 4, "pp=2,cp=2,ep=2,schedule=svpp,slices=2"),
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
        *BATCH,
        *AUX_OFF,
        *extra,
    )


def _train_rows(rank: int, rows: dict[str, list[str]]) -> dict[str, tuple[dict, dict]]:
    """A ``run_ranks`` worker: every row's first-step gradients on this rank, and the
    share of each gradient the rank holds."""
    out = {}
    for name, args in rows.items():
        shares: dict[str, float] = {}
        swapped: list[int] = []
        out[name] = (first_step_gradients(args, STEPS, shares, swapped), shares, swapped[0])
    return out


def _log(run: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records], [r["grad_norm"] for r in records]


@pytest.fixture(scope="module")
def runs(small_train_args, tmp_path_factory: pytest.TempPathFactory):
    """``runs(row)``: (one process: grads, losses, norms), (ranks' grads, losses, norms),
    shares, bytes swapped to the host per rank. Each (family, world size) is launched once,
    for all its rows, when a test first asks for one of them: a selection without the 4-
    and 8-process rows (``-m "not slow"``) never starts those oversubscribed launches."""
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
            model, world = ROWS[row][:2]
            rows = {  # one launch per (family, world size)
                name: _args(small_train_args, root / name, m, f"--parallel.strategy={text}")
                for name, (m, size, text) in ROWS.items()
                if (m, size) == (model, world)
            }
            ranks = run_ranks(_train_rows, rows, world_size=world, timeout_s=600)
            for name in rows:
                got = ([r[name][0] for r in ranks], *_log(root / name))
                out[name] = (reference(ROWS[name][0]), got, [r[name][1] for r in ranks],
                             [r[name][2] for r in ranks])  # fmt: skip
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
    (want_grads, want_losses, want_norms), (grads, losses, norms), *_ = runs(row)
    assert losses == pytest.approx(want_losses, rel=RTOL)
    assert norms == pytest.approx(want_norms, rel=RTOL)
    assert_same_gradients(grads, want_grads, RTOL)


def _data_parallel(text: str) -> bool:
    s = Strategy.parse(text)
    return "zero=" in text and s.dp * s.cp > 1


@pytest.mark.parametrize("row", _rows(_data_parallel))
def test_zero_shards_what_it_says(row: str, runs) -> None:
    """ZeRO >= 1 leaves each rank about half of every gradient (two data-parallel ranks);
    zero=0 (DDP, the step's all-reduce) shards nothing over dp: a replicated weight's
    gradient (the norms') is whole on every rank, the experts' 1/ep."""
    shares = [share for rank in runs(row)[2] for share in rank.values()]
    if "zero=0" in ROWS[row][2]:
        ep = Strategy.parse(ROWS[row][2]).ep
        for rank in runs(row)[2]:
            for name, share in rank.items():
                if ".mlp.experts." in name:
                    assert share == 1 / ep, name
                elif "norm" in name:
                    assert share == 1.0, name
    else:
        assert max(shares) <= 0.51, max(shares)


@pytest.mark.parametrize("row", _rows(lambda text: "swap=1" in text))
def test_swap_moves_activations(row: str, runs) -> None:
    """A swap row equal to one process because nothing was swapped would prove nothing:
    every rank moved activations to the host (DTensors under tp included)."""
    assert all(moved > 0 for moved in runs(row)[3])
