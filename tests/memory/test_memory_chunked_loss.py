"""Chunked LM head + cross-entropy: same loss and gradients as the unchunked path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from legato.errors import ConfigError
from legato.memory import chunked_cross_entropy, chunked_lm_loss
from legato.models import build_model
from legato.specs import load_model


def _inputs(dtype=torch.float32, tokens=70, hidden=32, vocab=300):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, tokens // 2, hidden, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) / 4).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (2, tokens // 2), generator=g)
    labels[0, :7] = -100
    return h, w, labels


def _grads(loss_fn, h, w, labels):
    h.grad = w.grad = None
    loss = loss_fn(h, w, labels)
    loss.backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


def _reference(h, w, labels):
    return F.cross_entropy(F.linear(h, w).float().flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("chunk", [1, 16, 35, 1000])
def test_fp32_matches_unchunked(chunk: int) -> None:
    h, w, labels = _inputs()
    got = _grads(lambda *a: chunked_cross_entropy(*a, chunk_size=chunk), h, w, labels)
    ref = _grads(_reference, h, w, labels)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_sum_reduction_matches_unchunked() -> None:
    h, w, labels = _inputs()

    def reference(h, w, labels):
        logits = F.linear(h, w).float().flatten(0, 1)
        return F.cross_entropy(logits, labels.flatten(), reduction="sum")

    got = _grads(lambda *a: chunked_cross_entropy(*a, chunk_size=16, reduction="sum"), h, w, labels)
    for a, b in zip(got, _grads(reference, h, w, labels), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_matches_unchunked_within_bf16_rounding() -> None:
    h, w, labels = _inputs(torch.bfloat16)
    got = _grads(lambda *a: chunked_cross_entropy(*a, chunk_size=16), h, w, labels)
    ref = _grads(_reference, h, w, labels)
    assert got[1].dtype == got[2].dtype == torch.bfloat16
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-4)


def test_no_grad_gives_the_same_loss_and_all_ignored_gives_zero() -> None:
    h, w, labels = _inputs()
    with torch.no_grad():
        loss = chunked_cross_entropy(h, w, labels, chunk_size=8)
    torch.testing.assert_close(loss, _reference(h, w, labels).detach())
    ignored = torch.full_like(labels, -100)
    assert float(chunked_cross_entropy(h, w, ignored).detach()) == 0.0


@pytest.mark.parametrize("preset", ["tiny", "tiny-gpt"])  # separate head, tied embeddings
def test_model_loss_and_parameter_grads_match(preset: str) -> None:
    spec = load_model(preset).with_(num_layers=2, vocab_size=258, seq_len=32)
    ids = torch.randint(0, 258, (2, 32), generator=torch.Generator().manual_seed(1))
    labels = ids.roll(-1, dims=1)
    results = []
    for chunked in (False, True):
        model = build_model(spec, seed=0)
        if chunked:
            loss = chunked_lm_loss(model, ids, labels, chunk_size=24)
        else:
            loss = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)
    for a, b in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bad_chunk_size_and_reduction_are_config_errors() -> None:
    h, w, labels = _inputs()
    with pytest.raises(ConfigError, match="loss_chunk"):
        chunked_cross_entropy(h, w, labels, chunk_size=0)
    with pytest.raises(ConfigError, match="allowed: mean, sum"):
        chunked_cross_entropy(h, w, labels, reduction="none")


def _vocabulary_parallel_rank(rank: int, sequence_split: bool) -> tuple:
    """One rank of a 2-way vocabulary-parallel head (an uneven split: 300 rows as 150/150
    here, 259 in the strategy rows): its loss, the hidden states' gradient and its rows of
    the weight's gradient, as the chunked loss computes them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    h, w, labels = _inputs(vocab=259)
    weight = distribute_tensor(w.detach(), mesh, [Shard(0)]).requires_grad_()
    whole = h.detach().requires_grad_()
    hidden = DTensor.from_local(whole, mesh, [Replicate()], run_check=False)
    if sequence_split:
        hidden = hidden.redistribute(mesh, [Shard(1)])
    loss = chunked_cross_entropy(hidden, weight, labels, chunk_size=16, reduction="sum")
    loss.backward()
    return loss.detach(), whole.grad, weight.grad.to_local()


@pytest.mark.distributed
@pytest.mark.parametrize("sequence_split", [False, True], ids=["replicated", "sequence-split"])
def test_a_vocabulary_parallel_head_gives_the_unsplit_loss_and_gradients(sequence_split):
    """Under tp the chunked loss reduces the softmax and the hidden states' gradient over
    the ranks holding the vocabulary's rows: every rank gets the whole loss and hidden
    gradient, and its own rows of the weight's gradient."""
    from gloo_harness import run_ranks

    h, w, labels = _inputs(vocab=259)
    want = _grads(
        lambda h, w, y: F.cross_entropy(
            F.linear(h, w).flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum"
        ),
        h,
        w,
        labels,
    )
    ranks = run_ranks(_vocabulary_parallel_rank, sequence_split, world_size=2, timeout_s=120)
    rows = torch.arange(259).chunk(2)
    for rank, (loss, grad_h, grad_w) in enumerate(ranks):
        assert loss == pytest.approx(want[0].item(), rel=1e-5)
        torch.testing.assert_close(grad_h, want[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad_w, want[2][rows[rank]], rtol=1e-5, atol=1e-6)
