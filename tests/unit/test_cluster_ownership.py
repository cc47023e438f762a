"""Chunk ownership: balanced, agreed on by every process, stable when members change."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from lota.cluster.ownership import TABLE_SIZES, Ownership, chunk_key, table_size

MEMBERS = [f"10.0.0.{i}:9000" for i in range(1, 51)]


def _keys(count: int) -> list[bytes]:
    # 1,000 objects of 100 chunks each, as a dataset's shards would be.
    return [chunk_key("data", f"shard-{i // 100:05d}.tar", '"e"', i % 100) for i in range(count)]


def test_chunks_spread_over_the_members_within_10_percent_of_ideal() -> None:
    ownership = Ownership(MEMBERS)
    counts = Counter(ownership.owner(k) for k in _keys(100_000))
    assert set(counts) == set(MEMBERS)
    mean = 100_000 / len(MEMBERS)
    assert max(counts.values()) / mean <= 1.10, max(counts.values()) / mean
    assert min(counts.values()) / mean >= 0.90
    slots = ownership.slots()
    assert max(slots.values()) - min(slots.values()) <= 1  # Maglev: M/n slots each, +- 1


def test_the_chunks_of_one_object_uploaded_in_one_put_go_to_every_node() -> None:
    ownership = Ownership(MEMBERS[:6])
    owners = Counter(ownership.owner(chunk_key("ckpt", "model.pt", '"x"', i)) for i in range(600))
    assert len(owners) == 6 and max(owners.values()) < 2 * 100


def test_the_table_depends_on_the_set_of_members_not_their_order() -> None:
    keys = _keys(2_000)
    one = Ownership(MEMBERS)
    other = Ownership(reversed(MEMBERS + MEMBERS[:3]))
    assert [one.owner(k) for k in keys] == [other.owner(k) for k in keys]


def test_another_process_agrees_on_every_owner() -> None:
    """No salted hash(): a fresh interpreter (another PYTHONHASHSEED) picks the same owners."""
    code = (
        "from lota.cluster.ownership import Ownership, chunk_key\n"
        f"o = Ownership({MEMBERS!r})\n"
        "print(','.join(o.owner(chunk_key('b', f'k{i}', 'e', i)) for i in range(200)))\n"
    )
    env = {"PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    here = Ownership(MEMBERS)
    assert out.stdout.strip() == ",".join(
        here.owner(chunk_key("b", f"k{i}", "e", i)) for i in range(200)
    )


def test_a_member_leaving_moves_little_more_than_its_own_chunks() -> None:
    keys = _keys(20_000)
    before = Ownership(MEMBERS)
    after = Ownership(MEMBERS[1:])
    moved = [k for k in keys if before.owner(k) != after.owner(k)]
    own = [k for k in keys if before.owner(k) == MEMBERS[0]]
    assert set(own) <= set(moved)  # the leaver's chunks all move...
    assert len(moved) <= 2 * len(own) + 0.01 * len(keys)  # ...and few others do
    # It coming back restores the first table exactly (a restarted node takes its chunks back).
    back = Ownership(MEMBERS)
    assert [back.owner(k) for k in keys] == [before.owner(k) for k in keys]


def test_the_next_owners_are_distinct_agreed_and_start_with_the_owner() -> None:
    ownership, again = Ownership(MEMBERS), Ownership(MEMBERS)  # built apart, agreeing
    for key in _keys(500):
        order = ownership.owners(key, 3)
        assert order[0] == ownership.owner(key) and len(set(order)) == 3
        assert order == again.owners(key, 3)
    assert Ownership(["a:1", "b:1"]).owners(b"k", 5) in (["a:1", "b:1"], ["b:1", "a:1"])
    second = Counter(ownership.owners(k, 2)[1] for k in _keys(20_000))
    assert len(second) == len(MEMBERS)  # fallbacks spread too


def test_table_sizes_hold_100_slots_per_member() -> None:
    assert table_size(6) == table_size(655) == TABLE_SIZES[0]
    assert table_size(656) == table_size(2_000) == TABLE_SIZES[1]
    with pytest.raises(ValueError):
        table_size(20_000)
    with pytest.raises(ValueError):
        Ownership([])
