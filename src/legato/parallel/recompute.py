"""The recompute applier: activation checkpointing as the cost model prices it.

* ``selective`` (Korthikanti et al.): only the attention core (QK^T, softmax, AV) is
  recomputed; its inputs q, k, v are kept, the [S x S] intermediates are not.
* ``full``: every block keeps only its input and runs its forward again in the backward.

Both use ``torch.utils.checkpoint`` (non-reentrant, so FSDP2's pre-backward gather and
DTensor work inside the recomputation). ``full`` replaces each block's ``forward`` on the
instance rather than wrapping the block in ``checkpoint_wrapper``: the wrapper renames
every parameter (``..._checkpoint_wrapped_module...``), and checkpoints, gradient checks
and exports key parameters by the model's own names.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from legato.specs.strategy import Strategy


def apply_recompute(model: nn.Module, strategy: Strategy) -> None:
    """Checkpoint ``model.blocks`` by ``strategy.recompute`` (nothing for ``none``)."""
    for block in model.blocks:
        if strategy.recompute == "selective":
            block.self_attn.recompute_core = True
        elif strategy.recompute == "full":
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
