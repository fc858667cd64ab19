"""The swap applier: every block's saved activations go to host memory (XTuner V1).

Last in ``parallelize``'s order: ``ActivationSwap`` hooks the blocks' ``__call__`` and
recognises FSDP2's gathered parameters, so it must see the model as it will run.
"""

from __future__ import annotations

from torch import nn

from legato.memory import ActivationSwap


def apply_swap(model: nn.Module) -> ActivationSwap:
    """Swap the saved activations of ``model.blocks``; keep the returned object alive as
    long as the model trains (its hooks live with it)."""
    return ActivationSwap(model.blocks)
