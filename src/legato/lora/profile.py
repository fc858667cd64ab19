"""Measure what the packing scheduler needs: fused-step time and activation bytes per token.

Both are measured on the real backbone with a probe adapter on random tokens, because
neither is well predicted from FLOPs on small LoRA shapes (kernel efficiency at small
GEMMs is exactly the problem being solved). Activation memory is counted as the bytes of
the tensors autograd saves for backward (distinct storages), which is the part of a
training step's memory that grows with the packed token count; it is measured the same
way on every device, and on CUDA :func:`memory_budget_bytes` reads the free memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import torch

from legato.lora.adapter import AdapterShape, LoraAdapter
from legato.lora.packed_model import MultiLoraModel, TaskRows
from legato.lora.scheduler import CostProfile
from legato.lora.task_data import Sequences

_CPU_BUDGET_FRACTION = 0.5
_GPU_BUDGET_FRACTION = 0.8
_FALLBACK_BUDGET = 8 * 2**30


def saved_tensor_bytes(fn: Callable[[], object]) -> tuple[object, int]:
    """Run ``fn`` and return (its result, bytes of distinct storages saved for backward)."""
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(seen.values())


def probe_rows(
    vocab: int, seq_len: int, tokens: int, device: torch.device, adapter: LoraAdapter | None
) -> list[TaskRows]:
    """Random sequences totalling about ``tokens`` (at least one sequence)."""
    n = max(1, tokens // seq_len)
    ids = torch.randint(0, vocab, (n, seq_len), device=device)
    pos = torch.arange(seq_len, device=device).expand(n, seq_len)
    return [TaskRows("probe", adapter, Sequences(ids, ids, pos, None))]


def probe_adapter(model: MultiLoraModel, shapes: Sequence[AdapterShape]) -> LoraAdapter:
    """One adapter on the union of the tasks' targets with their largest rank."""
    targets = tuple(sorted({t for s in shapes for t in s.target_modules}))
    rank = max(s.rank for s in shapes)
    device = model.base.output_weight().device
    return LoraAdapter("probe", AdapterShape(rank, rank, 0.0, targets), model.base, device=device)


def _step(model: MultiLoraModel, rows: list[TaskRows]) -> None:
    loss = sum(model(rows))
    loss.backward()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_cost(
    model: MultiLoraModel,
    adapter: LoraAdapter,
    seq_len: int,
    token_counts: Sequence[int],
    repeats: int = 2,
) -> CostProfile:
    """Fastest of ``repeats`` timings of a fused forward + backward at each token count."""
    device = model.base.output_weight().device
    vocab = model.base.spec.vocab_size
    counts = sorted({max(seq_len, t // seq_len * seq_len) for t in token_counts})
    _step(model, probe_rows(vocab, seq_len, counts[0], device, adapter))  # warm-up
    seconds = []
    for count in counts:
        rows = probe_rows(vocab, seq_len, count, device, adapter)
        best = float("inf")
        for _ in range(repeats):
            _sync(device)
            begin = time.perf_counter()
            _step(model, rows)
            _sync(device)
            best = min(best, time.perf_counter() - begin)
        seconds.append(best)
    adapter.zero_grad(set_to_none=True)
    return CostProfile(tuple(counts), tuple(seconds))


def activation_bytes_per_token(model: MultiLoraModel, adapter: LoraAdapter, seq_len: int) -> float:
    """Saved-for-backward bytes per packed token: the slope between two probe sizes."""
    device = model.base.output_weight().device
    vocab = model.base.spec.vocab_size
    sizes = (seq_len, 3 * seq_len)
    measured = []
    for size in sizes:
        rows = probe_rows(vocab, seq_len, size, device, adapter)
        losses, nbytes = saved_tensor_bytes(lambda rows=rows: model(rows))
        measured.append(nbytes)
        del losses
    return max(1.0, (measured[1] - measured[0]) / (sizes[1] - sizes[0]))


def memory_budget_bytes(device: torch.device) -> int:
    """Memory a fused step may use: 80% of free GPU memory, or half the available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * _GPU_BUDGET_FRACTION)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return _FALLBACK_BUDGET
    return int(available * _CPU_BUDGET_FRACTION)
