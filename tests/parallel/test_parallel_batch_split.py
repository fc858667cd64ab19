"""Uneven local batches: one micro-batch count for all ranks, near-equal chunks, refusals."""

from __future__ import annotations

import pytest

from legato.errors import ConfigError
from legato.parallel.batch_split import (
    check_batch_split,
    chunk_sizes,
    even_split,
    microbatch_count,
)


def test_every_rank_runs_the_largest_rank_s_micro_batch_count() -> None:
    assert microbatch_count([5, 3], 2) == 3
    assert microbatch_count([4, 4], 2) == 2 == microbatch_count(even_split(8, 2), 2)
    assert microbatch_count([6, 2], 4) == 2


def test_chunks_are_nearly_equal_and_never_exceed_mbs() -> None:
    assert chunk_sizes(5, 3) == [2, 2, 1]
    assert chunk_sizes(3, 3) == [1, 1, 1]
    assert chunk_sizes(8, 2) == [4, 4]
    for rows in range(1, 40):
        for mbs in range(1, 9):
            sizes = chunk_sizes(rows, microbatch_count([rows], mbs))
            assert sum(sizes) == rows and max(sizes) <= mbs and min(sizes) >= max(sizes) - 1


def test_a_split_that_would_need_an_empty_chunk_is_refused() -> None:
    check_batch_split([5, 3], 8, 2, dp=2)  # 3 micro-batches: 2+2+1 and 1+1+1
    with pytest.raises(
        ConfigError, match=r"= 3 .*got \[6, 2\]; raise train.micro_batch_size to >= 3"
    ):
        check_batch_split([6, 2], 8, 2, dp=2)
    check_batch_split([6, 2], 8, 3)  # ceil(6/3) = 2 micro-batches, 2 rows suffice
