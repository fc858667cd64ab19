"""Activation swap: identical training math, fewer activation bytes resident on the device,
selectable per block, and composable with activation checkpointing."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from legato.memory import ActivationSwap, SavedBytes, count_saved_tensors
from legato.models import build_model
from legato.models.attention import SdpaAttention
from legato.models.forward_context import ForwardContext
from legato.precision import convert_to_fp8
from legato.specs import load_model

IDS = torch.randint(0, 258, (2, 48), generator=torch.Generator().manual_seed(0))


def _spec(preset: str = "tiny", layers: int = 6):
    return load_model(preset).with_(num_layers=layers, vocab_size=258, seq_len=48)


def _train_step(model, setup=None, forward=None):
    """Loss, parameter grads and the saved-bytes ledger of one forward/backward."""
    stats = SavedBytes()
    if setup is not None:
        setup(model, stats)
    with count_saved_tensors(stats):
        logits = forward(model) if forward is not None else model(IDS)
        loss = F.cross_entropy(logits.flatten(0, 1), IDS.roll(-1, 1).flatten())
    forward_device = stats.device
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], stats, forward_device


def _assert_same_math(a, b) -> None:
    assert torch.equal(a[0], b[0])
    for x, y in zip(a[1], b[1], strict=True):
        assert torch.equal(x, y)


def _swap(layers=None):
    return lambda m, s: ActivationSwap(m.blocks, layers=layers, stats=s, min_bytes=0)


def test_swap_keeps_losses_and_grads_bitwise_and_lowers_device_bytes() -> None:
    base = _train_step(build_model(_spec(), seed=0))
    swapped = _train_step(build_model(_spec(), seed=0), _swap())
    _assert_same_math(swapped, base)
    stats = swapped[2]
    assert swapped[3] < base[3] / 5  # after forward: activations live on the host
    assert stats.peak_device < base[2].peak_device / 2  # backward holds ~2 of 6 blocks
    assert stats.to_host == stats.to_device == stats.peak_host > 0
    assert stats.device == stats.host == 0  # everything released after backward


def test_blocks_are_selectable() -> None:
    full = _train_step(build_model(_spec(), seed=0), _swap())[2]
    base = _train_step(build_model(_spec(), seed=0))
    some = _train_step(build_model(_spec(), seed=0), _swap(layers=[1, 4]))
    _assert_same_math(some, base)
    assert some[2].to_host * 3 == full.to_host  # identical blocks: 2 of 6


def test_moe_model_and_retained_graph() -> None:
    base = build_model(_spec("tiny-moe", 2), seed=0)
    model = build_model(_spec("tiny-moe", 2), seed=0)
    ActivationSwap(model.blocks, min_bytes=0)
    for m in (base, model):
        loss = F.cross_entropy(m(IDS).flatten(0, 1), IDS.flatten())
        loss.backward(retain_graph=True)
        loss.backward()  # second use of the swapped tensors re-fetches them
    for p, q in zip(base.parameters(), model.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def _manual_forward(model, blocks_via):
    """The decoder loop with each block called through ``blocks_via(i, block, x, rope)``."""
    x = model.model.embed_tokens(IDS)
    rope = ForwardContext(
        model.model.rotary_emb(torch.arange(IDS.shape[1]).expand_as(IDS)), SdpaAttention()
    )
    for i, block in enumerate(model.blocks):
        x = blocks_via(i, block, x, rope)
    return F.linear(model.model.norm(x), model.output_weight())


def test_composes_with_non_reentrant_checkpoint() -> None:
    """Blocks 0-2 checkpointed (their recomputation in backward re-enters the swap hooks,
    which must stay out of it), blocks 3-5 swapped."""

    def via(i, block, x, rope):
        if i < 3:
            return checkpoint(block, x, rope, use_reentrant=False)
        return block(x, rope)

    base = _train_step(build_model(_spec(), seed=0), forward=lambda m: _manual_forward(m, via))
    mixed = _train_step(
        build_model(_spec(), seed=0), _swap(), forward=lambda m: _manual_forward(m, via)
    )
    _assert_same_math(mixed, base)
    assert mixed[2].to_host > 0 and mixed[2].device == 0


def _checkpoint_blocks(model) -> None:
    """Per-block reentrant checkpointing the way a trainer installs it: the block's own
    forward runs under ``checkpoint``, so the swap hooks (on ``__call__``) surround it."""
    for block in model.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=True)


def test_reentrant_checkpoint_inputs_are_swapped() -> None:
    """Checkpoint + swap on the same blocks: only block inputs are saved, and they move to
    the host (XTuner's recipe for 64K-token sequences)."""
    ckpt = _train_step(build_model(_spec(), seed=0), lambda m, s: _checkpoint_blocks(m))

    def both_setup(model, stats) -> None:
        _checkpoint_blocks(model)
        _swap()(model, stats)

    both = _train_step(build_model(_spec(), seed=0), both_setup)
    _assert_same_math(both, ckpt)
    block_input = IDS.numel() * _spec().hidden_size * 4
    assert both[2].to_host == 6 * block_input
    assert both[3] == ckpt[3] - 6 * block_input


def test_swaps_fp8_cached_activations_too() -> None:
    """FP8 linears save e4m3 activations from inside their autograd Function."""

    def fp8_model():
        model = build_model(_spec(layers=2), seed=0)
        convert_to_fp8(model)
        return model

    base = _train_step(fp8_model())
    swapped = _train_step(fp8_model(), _swap())
    _assert_same_math(swapped, base)
    assert swapped[2].peak_device < base[2].peak_device
