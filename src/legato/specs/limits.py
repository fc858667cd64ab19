"""Upper bounds on the integers users give, so an absurd value is one error, not a price.

Without them ``gbs=99999999999999999999`` is accepted, priced and planned (or overflows
deep inside torch). Each bound is far above anything that exists today and far below
where the arithmetic or the memory of the planner and the trainer would break:

- ``MAX_DEVICES = 2**20`` (about a million accelerators; the largest training clusters
  have ~10**5): every parallel degree, process, node and device count.
- ``MAX_BATCH = 2**24`` (16.7 M sequences per step; published runs use ~10**4):
  global and micro-batch sizes, LoRA ranks and per-task batch sizes.
- ``MAX_SIZE = 2**24`` (16.7 M): tokens per sequence, model dimensions and counts
  (hidden size, layers, heads, vocabulary, experts), sequence slices and MoE pieces.
- ``MAX_STEPS = 2**40`` (10**12 optimizer steps, ~30,000 years at one per ms): step
  counts, intervals, and token budgets such as the tokens of one loss chunk.

Integers outside 64 bits are refused earlier, by ``specs.typed.convert``.
"""

from __future__ import annotations

from legato.errors import LegatoError

MAX_DEVICES = 2**20
MAX_BATCH = 2**24
MAX_SIZE = 2**24
MAX_STEPS = 2**40


def check_at_most(
    name: str, value: int, bound: int, error: type[LegatoError], low: int = 1
) -> None:
    """Raise ``error`` naming ``name`` and the range ``[low, bound]`` if ``value > bound``."""
    if value > bound:
        exponent = bound.bit_length() - 1
        shown = f"2**{exponent} = {bound}" if bound == 1 << exponent else str(bound)
        raise error(f"{name}: must be between {low} and {shown}, got {value}")
