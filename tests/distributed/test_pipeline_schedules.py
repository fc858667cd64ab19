"""Every schedule of the IR, executed by the pipeline runtime on 2 real gloo processes,
gives the unpipelined model's loss and gradients: slices (equal-FLOP cuts), virtual
stages (interleaved and V placement), split B/W with W subtasks, tied embeddings on one
rank and across ranks, ignored labels, and a second step on the same runner.

One spawn runs all cases; each rank compares the gradients of the parameters it holds
with a full-model backward it computes itself, and writes the differences to a file.
"""

from __future__ import annotations

import pytest
import torch

from gloo_harness import run_ranks
from legato.models import build_model
from legato.parallel.pipeline import PipelineRunner, build_stages, token_cross_entropy
from legato.schedule import build_schedule
from legato.specs.model import ModelSpec

pytestmark = pytest.mark.distributed

# fp32 throughout; the pipeline sums the same terms in another order (per slice, per
# micro-batch, W as separate GEMMs), so differences are rounding only (seen: ~1e-8).
LOSS_TOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6

_BASE = {"hidden_size": 32, "num_layers": 4, "num_heads": 4, "vocab_size": 61, "seq_len": 32}
SPECS = {
    "llama": ModelSpec(name="llama", num_kv_heads=2, ffn_hidden_size=48, **_BASE),
    "gpt": ModelSpec(
        name="gpt", mlp="gelu", norm="layernorm", position="learned", bias=True,
        tied_embeddings=True, ffn_hidden_size=48, **_BASE,
    ),
}  # fmt: skip
CASES = [
    ("gpipe", "llama", {}),
    ("1f1b", "llama", {}),
    ("interleaved", "llama", {"chunks": 2}),
    ("zb-h1", "llama", {"w_subtasks": 2}),
    ("zb-2p", "llama", {}),
    ("zb-v", "llama", {"w_subtasks": 3}),
    ("seq1f1b", "llama", {"slices": 4, "slicing": "equal-flops"}),
    ("svpp", "llama", {"chunks": 2, "slices": 4, "w_subtasks": 2, "slicing": "equal-flops"}),
    ("svpp", "llama", {"chunks": 2, "slices": 2, "memory_cap": 4}),  # the dependency floor
    ("1f1b", "gpt", {}),  # tied embedding matrix on both ranks
    ("zb-v", "gpt", {}),  # tied, first and last stage on rank 0
    ("svpp", "gpt", {"chunks": 2, "slices": 3, "w_subtasks": 4}),
]
MICROBATCHES = 4


def _batch(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, spec.vocab_size, (8, spec.seq_len), generator=generator)
    labels = torch.randint(0, spec.vocab_size, (8, spec.seq_len), generator=generator)
    labels[:, :3] = -100  # ignored tokens change the normaliser
    return ids, labels


def _reference(spec: ModelSpec, ids, labels):
    model = build_model(spec, seed=11)
    loss = token_cross_entropy(model(ids), labels) / (labels != -100).sum()
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def _run_case(rank: int, name: str, spec_name: str, options: dict, steps: int) -> dict:
    spec = SPECS[spec_name]
    ids, labels = _batch(spec)
    ref_loss, ref_grads = _reference(spec, ids, labels)
    schedule = build_schedule(name, stages=2, microbatches=MICROBATCHES, **options)
    model = build_model(spec, seed=11)
    stages = build_stages(model, schedule.placement, rank)
    runner = PipelineRunner(stages, schedule, rank=rank)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = runner.step(ids, labels)
    mine = {id(p) for s in stages.values() for p in s.parameters()}
    errors = {}
    for n, p in model.named_parameters():
        if id(p) in mine:
            try:
                torch.testing.assert_close(p.grad, ref_grads[n], rtol=GRAD_RTOL, atol=GRAD_ATOL)
                errors[n] = None
            except (AssertionError, TypeError) as exc:
                errors[n] = str(exc).splitlines()[0] if str(exc) else "no gradient"
    return {
        "loss": None if loss is None else loss.item(),
        "ref_loss": ref_loss,
        "grads": errors,
        "params": [n for n, _ in model.named_parameters()],
        "peak_bytes": runner.stats.peak_activation_bytes,
    }


def _worker(rank: int) -> list[dict]:
    return [
        _run_case(rank, name, spec, options, steps=2 if i == 0 else 1)
        for i, (name, spec, options) in enumerate(CASES)
    ]


@pytest.fixture(scope="module")
def results() -> list[tuple[dict, dict]]:
    return list(zip(*run_ranks(_worker, timeout_s=60), strict=True))


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_schedule_matches_unpipelined_model(results, case):
    rank0, rank1 = results[case]
    losses = [r["loss"] for r in (rank0, rank1) if r["loss"] is not None]
    assert len(losses) == 1  # exactly one rank holds the last stage
    assert losses[0] == pytest.approx(rank0["ref_loss"], abs=LOSS_TOL)
    checked = {**rank0["grads"], **rank1["grads"]}
    assert sorted(checked) == sorted(rank0["params"])  # every parameter lives somewhere
    wrong = {n: e for n, e in checked.items() if e is not None}
    assert not wrong
    assert min(rank0["peak_bytes"], rank1["peak_bytes"]) > 0
