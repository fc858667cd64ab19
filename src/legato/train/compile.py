"""``train.compile``: each transformer block's forward compiled by ``torch.compile``.

As torchtitan does, per block rather than the whole model: the blocks of a model are
alike, so dynamo traces one graph and reuses it (the compile time does not grow with the
depth), and what runs around a block stays eager: FSDP2's gathers and reduce-scatters,
the pipeline runner, the loss. The instance's ``forward`` is replaced (as
``parallel.recompute`` does) rather than the block wrapped by ``torch.compile(block)``,
whose ``OptimizedModule`` renames every parameter (``_orig_mod.``) and so every
checkpoint key. It runs after ``parallelize``: the compiled code is the laid-out block's
(tensor-parallel DTensor weights, FP8 linears, the recompute checkpoint around it).

Checked equal to eager (``tests/train/test_train_compile.py`` and by hand with
``aot_eager``): dp at every ZeRO level, recompute, swap, the chunked loss, fp32, bf16 and
FP8. ``REFUSED``: the strategy keys under which a compiled block does not run or is not
known to, each with its reason; ``check_compile`` turns them into one line before any
process starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legato.errors import ConfigError
from legato.specs.strategy import Strategy

if TYPE_CHECKING:
    from torch import nn

FIELD = "train.compile"
# strategy key -> why a compiled block does not run under it (a degree > 1 refuses)
REFUSED: dict[str, str] = {
    "tp": "dynamo fails on the tensor-parallel blocks' DTensor hooks (torch 2.13: "
    "'Tensor' object has no attribute '_local_tensor')",
    "pp": "the pipeline runner changes each unit's linear layers (deferred weight "
    "gradients) and attention (slices) through Python state a compiled graph would freeze",
    "cp": "context-parallel attention is chosen through a context variable a compiled "
    "graph would freeze; not yet checked against eager",
    "ep": "the expert dispatch sizes its all-to-alls from routed counts (data-dependent "
    "shapes); not yet checked against eager",
}


def refusal(strategy: Strategy) -> str:
    """Why ``strategy`` cannot run compiled blocks ('' when it can)."""
    for key, why in REFUSED.items():
        if getattr(strategy, key) > 1:
            return f"{key}={getattr(strategy, key)} ({why})"
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
