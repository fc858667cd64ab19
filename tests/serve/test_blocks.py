"""Block accounting under random load: every block is free, cached-and-idle or in use, the
parent/child links of cached blocks stay exact through evictions, a prefix is only found
under its own adapter and version, and nothing leaks."""

from __future__ import annotations

import random

import pytest

from legato.serve.blocks import BlockManager, OutOfBlocks, block_hash, prefix_root


def _fill(manager, root, tokens):
    """Allocate and commit the full blocks of ``tokens`` as a request would."""
    blocks, chain = [], root
    for start in range(0, len(tokens), manager.block_size):
        blocks.append(manager.allocate())
        chunk = tokens[start : start + manager.block_size]
        if len(chunk) == manager.block_size:
            chain = block_hash(chain, chunk)
            manager.commit(blocks[-1], chain)
    return blocks


def test_prefix_found_only_under_the_same_adapter_version():
    manager = BlockManager(16, 4)
    tokens = list(range(13))
    blocks = _fill(manager, prefix_root("a", 0), tokens)
    manager.release(blocks)
    assert manager.match(prefix_root("b", 0), tokens) == []
    assert manager.match(prefix_root("a", 1), tokens) == []
    assert manager.match(prefix_root(None, 0), tokens) == []
    found = manager.match(prefix_root("a", 0), tokens)
    assert found == blocks[:3]  # the three full blocks; the partial fourth was freed
    assert manager.match(prefix_root("a", 0), tokens[:8]) == blocks[:1]  # last token computed
    manager.release(found)
    manager.release(blocks[:1])
    manager.check()
    assert manager.in_use == 0


def test_random_load_keeps_accounting_exact():
    rng = random.Random(0)
    manager = BlockManager(24, 4)
    live: list[list[int]] = []
    for _ in range(2000):
        if live and (rng.random() < 0.45 or not (manager.free or manager.idle)):
            manager.release(live.pop(rng.randrange(len(live))))
        else:
            root = prefix_root(rng.choice(["a", "b", None]), 0)
            tokens = [rng.randrange(2) for _ in range(rng.randrange(2, 14))]
            blocks = manager.match(root, tokens)
            chain = root
            for i in range(len(blocks)):
                chain = block_hash(chain, tokens[i * 4 : i * 4 + 4])
            try:
                while len(blocks) < manager.blocks_for(len(tokens)):
                    if not manager.free and manager.idle:  # an LRU policy's eviction
                        manager.evict(next(iter(manager.idle)))
                    blocks.append(manager.allocate())
                    chunk = tokens[(len(blocks) - 1) * 4 : len(blocks) * 4]
                    if len(chunk) == 4:
                        chain = block_hash(chain, chunk)
                        manager.commit(blocks[-1], chain)
            except OutOfBlocks:
                manager.release(blocks)
                continue
            live.append(blocks)
        manager.check()
    for blocks in live:
        manager.release(blocks)
    manager.check()
    assert manager.in_use == 0 and manager.hits > 0
    with pytest.raises(AssertionError):
        manager.release([0])  # already free
