"""The priced keys' table against the Strategy and the runtime's checks (no process started).

Every field of ``Strategy`` has its row; every example sets its key; every example a
family can take is accepted by ``legato train`` for that family (the 2-process rows of
``tests/distributed/test_strategies.py`` then train them); every pair of examples of two
keys either resolves or is refused in one line, before any process starts.
"""

from __future__ import annotations

import itertools
from dataclasses import fields

import pytest

from coverage_rows import coverage_rows, examples
from legato.errors import LegatoError
from legato.specs.priced_keys import KEYS, PRICED_KEYS
from legato.specs.strategy import Strategy
from legato.train.config import load_config, resolve_model

SMALL = "num_layers = 4, hidden_size = 64, num_heads = 2, num_kv_heads = 2, seq_len = 64"
FAMILIES = {"tiny": False, "tiny-gpt": False, "tiny-moe": True, "tiny-deepseek": True}
BATCH = ("--train.global_batch_size=8", "--train.micro_batch_size=2")


def _resolve(preset: str, text: str, world: int) -> None:
    args = [f"--model.preset={preset}", f"--model.overrides={{{SMALL}}}", *BATCH]
    config = load_config(None, [*args, f"--parallel.strategy={text}"])
    config.job(resolve_model(config.model), world)


def _fits(preset: str):
    def fits(text: str) -> bool:
        try:
            _resolve(preset, text, 2)
        except LegatoError:
            return False
        return True

    return fits


def test_every_strategy_field_has_a_row() -> None:
    assert {f.name for f in fields(Strategy)} == set(KEYS)


@pytest.mark.parametrize("row", PRICED_KEYS, ids=[r.key for r in PRICED_KEYS])
def test_every_example_sets_its_key(row) -> None:
    """An example names its key (``tp=AxB`` sets ``tp_y``)."""
    for text in row.examples:
        given = {item.split("=")[0] for item in text.split(",")}
        assert row.key in given or (row.key == "tp_y" and Strategy.parse(text).tp_y > 1), text


@pytest.mark.parametrize(("preset", "moe"), FAMILIES.items())
def test_every_family_takes_every_priced_key(preset: str, moe: bool) -> None:
    rows, left_out = coverage_rows(_fits(preset), moe)
    assert left_out == []
    covered = {k for row in rows for k in (item.split("=")[0] for item in row.split(","))}
    assert covered >= {r.key for r in PRICED_KEYS if r.key not in ("dtype", "tp_y")
                       and (moe or not r.needs_moe)}  # fmt: skip


def _merge(a: str, b: str) -> str | None:
    left = dict(item.split("=") for item in a.split(","))
    right = dict(item.split("=") for item in b.split(","))
    if any(left[k] != v for k, v in right.items() if k in left):
        return None
    return ",".join(f"{k}={v}" for k, v in {**left, **right}.items())


@pytest.mark.parametrize(("preset", "moe"), FAMILIES.items())
def test_every_pair_resolves_or_is_refused_in_one_line(preset: str, moe: bool) -> None:
    refused = []
    for a, b in itertools.combinations(examples(moe), 2):
        text = _merge(a, b)
        if text is None:
            continue
        s = Strategy.parse(text)
        world = s.pp * s.tp * s.cp * max(s.dp, 2 if s.ep > 1 else 1)
        try:
            _resolve(preset, text, world)
        except LegatoError as exc:
            assert "\n" not in str(exc), text
            refused.append(text)
    assert len(refused) < len(examples(moe)) ** 2 / 4  # most pairs run
