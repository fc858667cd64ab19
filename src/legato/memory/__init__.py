"""Device-memory techniques of XTuner V1: activation swap to host and the chunked loss.

ActivationSwap(blocks, *, layers=None, min_bytes=65536, stats=None); .remove()
SavedBytes (device / host bytes of saved activations, peaks, copy traffic)
count_saved_tensors(stats)                      # the no-swap baseline ledger
chunked_cross_entropy(hidden, weight, labels, *, chunk_size=4096, ignore_index=-100)
chunked_lm_loss(model, input_ids, labels, *, position_ids, attn_mask, chunk_size, ...)
"""

from legato.memory.chunked_loss import chunked_cross_entropy, chunked_lm_loss
from legato.memory.saved import SavedBytes, count_saved_tensors
from legato.memory.swap import ActivationSwap

__all__ = [
    "ActivationSwap",
    "SavedBytes",
    "chunked_cross_entropy",
    "chunked_lm_loss",
    "count_saved_tensors",
]
