"""Shared pieces of the LoRA tests (imported as a module: tests/ has no packages)."""

from __future__ import annotations

import numpy as np

from legato.lora.config import TaskSection
from legato.lora.task_data import TaskStream
from legato.specs.model import ModelSpec

SPEC = ModelSpec(
    name="lora-test",
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=64,
    vocab_size=64,
    seq_len=64,
)


def synthetic_stream(seed: int, n: int = 3000, vocab: int = 64) -> TaskStream:
    """Random tokens in examples of ~30 tokens, ~70% of them trained on."""
    rng = np.random.default_rng(seed)
    return TaskStream(
        rng.integers(0, vocab, n).astype(np.int64),
        rng.random(n) < 0.7,
        np.cumsum(rng.random(n) < 0.03).astype(np.int64),
    )


def task(name: str, **fields) -> TaskSection:
    """A TaskSection with test-friendly defaults (fast learning rate, few steps)."""
    values = {"data": "unused.jsonl", "lr": 1e-2, "steps": 3, "batch_size": 2, "seq_len": 16}
    return TaskSection(name=name, **{**values, **fields})
