"""``train.compile``: each transformer block's forward compiled by ``torch.compile``.

As torchtitan does, per block rather than the whole model: the blocks of a model are
alike, so dynamo traces one graph and reuses it (the compile time does not grow with the
depth), and what runs around a block stays eager: FSDP2's gathers and reduce-scatters,
the pipeline runner, the loss. The instance's ``forward`` is replaced (as
``parallel.recompute`` does) rather than the block wrapped by ``torch.compile(block)``,
whose ``OptimizedModule`` renames every parameter (``_orig_mod.``) and so every
checkpoint key. It runs after ``parallelize``: the compiled code is the laid-out block's
(tensor-parallel DTensor weights, FP8 linears, the recompute checkpoint around it).

Checked equal to eager (``tests/train/test_train_compile.py``, ``aot_eager``): dp at
every ZeRO level, recompute, swap, the chunked loss, fp32, bf16 and FP8; on 2 processes
tp with sp, cp and ep (the routed experts run eagerly inside the compiled block:
``moe.layer``). ``REFUSED``: the strategies under which a compiled block does not run,
each with its reason; ``check_compile`` turns them into one line before any process
starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from legato.errors import ConfigError
from legato.specs.strategy import Strategy

if TYPE_CHECKING:
    from torch import nn

FIELD = "train.compile"
# (the keys of a strategy a compiled block does not run under, '' when it does; why)
REFUSED: tuple[tuple[Callable[[Strategy], str], str], ...] = (
    (lambda s: f"tp={s.tp} with sp=0" if s.tp > 1 and not s.sp else "",
     "dynamo's graph returns a plain tensor where the backward of the tensor-parallel "
     "blocks' replicated-input redistribution wants a DTensor (torch 2.13: 'Tensor' object "
     "has no attribute '_local_tensor'); tp with sp=1 compiles"),
    (lambda s: f"pp={s.pp}" if s.pp > 1 else "",
     "the pipeline runner changes each unit's linear layers (deferred weight gradients) "
     "and attention (slices) through Python state a compiled graph would freeze"),
)  # fmt: skip


def refusal(strategy: Strategy) -> str:
    """Why ``strategy`` cannot run compiled blocks ('' when it can)."""
    for keys, why in REFUSED:
        if label := keys(strategy):
            return f"{label} ({why})"
    return ""


def check_compile(strategy: Strategy) -> None:
    """One ``ConfigError`` naming the key when ``train.compile`` cannot run ``strategy``."""
    why = refusal(strategy)
    if why:
        raise ConfigError(f"{FIELD}: cannot compile under {why}; set train.compile = false")


def compile_blocks(module: nn.Module, backend: str) -> int:
    """Compile the forward of every block in ``module`` (a model, a laid-out model or a
    pipeline's stages) with ``backend``; returns how many. torch is imported here, not at
    the top: ``train.config`` checks the refusals, and ``legato plan`` writes configs
    without importing torch."""
    import torch
    from torch import nn

    count = 0
    for owner in module.modules():
        blocks = getattr(owner, "blocks", None)
        if not isinstance(blocks, nn.ModuleList):
            continue
        for block in blocks:
            block.forward = torch.compile(block.forward, backend=backend)
        count += len(blocks)
    return count
