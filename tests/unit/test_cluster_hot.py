"""The hot-chunk rule and the books of the copies it keeps."""

from __future__ import annotations

from lota.cluster.hot import Copies, HotChunks


def test_a_chunk_read_often_enough_within_the_window_turns_hot() -> None:
    hot = HotChunks(reads=3, window=60.0)
    assert [hot.read("c", t) for t in (0.0, 10.0, 20.0)] == [False, False, True]
    assert hot.read("c", 30.0)  # and stays hot while it is read
    # Reads spread wider than the window never add up.
    assert [hot.read("d", t) for t in (0.0, 61.0, 122.0, 183.0)] == [False] * 4


def test_the_chunks_tracked_stay_bounded() -> None:
    hot = HotChunks(reads=2, window=60.0, tracked=10)
    for i in range(100):
        hot.read(i, 0.0)
    assert len(hot._seen) == 10
    assert not hot.read(0, 1.0)  # forgotten: counting starts again


def test_copies_stay_within_their_share_releasing_the_oldest_first() -> None:
    copies = Copies(limit=100)
    assert copies.add("a", 40) == [] and copies.add("b", 40) == []
    assert copies.add("c", 40) == ["a"]
    assert "a" not in copies and "c" in copies and copies.bytes == 80
    assert copies.add("huge", 101) is None
    copies.forget("b")
    assert copies.bytes == 40
    assert Copies(limit=0).add("x", 1) is None  # hot_share = 0: no copies at all
