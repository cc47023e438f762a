"""S3-FIFO, the chunk eviction policy: queue moves, scan resistance, ghosts, busy keys."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given
from hypothesis import strategies as st

from lota.cache.eviction import S3FIFO


class Cache:
    """A cache of `capacity` unit-size items driven by S3-FIFO (or by LRU, to compare)."""

    def __init__(self, capacity: int, lru: bool = False) -> None:
        self.capacity = capacity
        self.policy: S3FIFO[str] = S3FIFO()
        self.lru: OrderedDict[str, None] | None = OrderedDict() if lru else None
        self.hits = self.misses = 0

    def get(self, key: str) -> bool:
        if self.lru is not None:
            return self._get_lru(self.lru, key)
        if key in self.policy:
            self.policy.access(key)
            self.hits += 1
            return True
        self.misses += 1
        while len(self.policy) >= self.capacity:
            assert self.policy.evict() is not None
        self.policy.insert(key, 1)
        return False

    def _get_lru(self, lru: OrderedDict[str, None], key: str) -> bool:
        if key in lru:
            lru.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        if len(lru) >= self.capacity:
            lru.popitem(last=False)
        lru[key] = None
        return False


def test_unaccessed_items_leave_in_fifo_order() -> None:
    policy: S3FIFO[int] = S3FIFO()
    for i in range(5):
        policy.insert(i, 10)
    assert [policy.evict() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert policy.evict() is None
    assert policy.bytes == 0


def test_accessed_item_in_small_moves_to_main_instead_of_leaving() -> None:
    policy: S3FIFO[str] = S3FIFO()
    policy.insert("hot", 1)
    policy.insert("cold", 1)
    policy.access("hot")
    assert policy.evict() == "cold"
    assert policy.queue_of("hot") == "main"
    assert policy.queue_of("cold") == "ghost"


def test_ghost_hit_goes_straight_to_main() -> None:
    policy: S3FIFO[str] = S3FIFO()
    policy.insert("a", 1)
    assert policy.evict() == "a"
    policy.insert("a", 1)
    assert policy.queue_of("a") == "main"
    policy.insert("b", 1)
    assert policy.queue_of("b") == "small"


def test_main_reinserts_accessed_items_with_decremented_frequency() -> None:
    policy: S3FIFO[str] = S3FIFO()
    for key in ("x", "y"):
        policy.insert(key, 1, established=True)
    for _ in range(2):
        policy.access("x")
    # x survives two passes of the main queue; y, never accessed, goes first.
    assert policy.evict() == "y"
    assert policy.evict() == "x"


def test_accesses_told_at_once_count_as_many_in_a_row() -> None:
    """As many passes of the main queue as accesses (up to three), told one by one or at
    once (a sibling worker's reads, told in a batch)."""
    for times in (1, 2, 5):
        orders = []
        for at_once in (False, True):
            policy: S3FIFO[str] = S3FIFO()
            for key in ("x", "y", "z"):
                policy.insert(key, 1, established=True)
            if at_once:
                policy.access("x", times)
            else:
                for _ in range(times):
                    policy.access("x")
            policy.access("y")
            orders.append([policy.evict() for _ in range(3)])
        assert orders[0] == orders[1]


def test_busy_items_are_never_chosen() -> None:
    policy: S3FIFO[int] = S3FIFO()
    for i in range(10):
        policy.insert(i, 1)
    busy = {0, 1, 2}
    victims = [policy.evict(busy.__contains__) for _ in range(7)]
    assert sorted(v for v in victims if v is not None) == list(range(3, 10))
    assert policy.evict(busy.__contains__) is None
    assert len(policy) == 3


def test_tails_name_the_next_victim_first_and_spare_gives_both_another_turn() -> None:
    policy: S3FIFO[str] = S3FIFO()
    assert policy.tails() == (None, None)
    for key in ("m1", "m2"):
        policy.insert(key, 10, established=True)
    policy.insert("s1", 1)
    policy.insert("s2", 1)
    assert policy.tails() == ("m1", "s1")  # small holds less than 10%: main goes first
    policy.spare()
    assert policy.tails() == ("m2", "s2")
    assert policy.evict() == "m2"
    assert policy.bytes == 12


def test_remove_forgets_without_ghost() -> None:
    policy: S3FIFO[str] = S3FIFO()
    policy.insert("a", 7)
    policy.insert("b", 5, established=True)
    policy.remove("a")
    policy.remove("b")
    policy.remove("missing")
    assert policy.bytes == 0
    assert len(policy) == 0
    assert policy.queue_of("a") is None


def test_scan_does_not_evict_a_reread_working_set() -> None:
    cache = Cache(capacity=100)
    hot = [f"hot{i}" for i in range(20)]
    for _ in range(2):
        for key in hot:
            cache.get(key)
    for i in range(5000):
        cache.get(f"scan{i}")
        if i % 50 == 0:
            assert all(cache.get(key) for key in hot), f"hot set lost at scan item {i}"


def test_scan_evicts_the_working_set_under_lru_but_not_under_s3fifo() -> None:
    """The same trace (a hot set re-read after every 150 scanned items) under both policies."""

    def run(cache: Cache) -> int:
        hot = [f"hot{i}" for i in range(20)]
        for key in hot * 2:
            cache.get(key)
        cache.hits = cache.misses = 0
        for i in range(3000):
            cache.get(f"scan{i}")
            if i % 150 == 149:
                for key in hot:
                    cache.get(key)
        return cache.hits

    assert run(Cache(100, lru=True)) == 0
    assert run(Cache(100)) == 20 * 20


def test_items_promoted_to_main_outlive_a_scan_without_rereads() -> None:
    cache = Cache(capacity=1000)
    for i in range(200):
        cache.get(f"main{i}")
        cache.get(f"main{i}")
    for i in range(5000):
        cache.get(f"scan{i}")
    assert all(cache.policy.queue_of(f"main{i}") == "main" for i in range(200))


@given(
    st.lists(
        st.tuples(st.sampled_from(["insert", "access", "remove", "evict"]), st.integers(0, 30)),
        max_size=300,
    )
)
def test_bytes_and_membership_stay_consistent(ops: list[tuple[str, int]]) -> None:
    policy: S3FIFO[int] = S3FIFO()
    model: dict[int, int] = {}
    busy = {3, 4}
    for op, key in ops:
        if op == "insert":
            policy.insert(key, key + 1)
            model[key] = key + 1
        elif op == "access":
            policy.access(key)
        elif op == "remove":
            policy.remove(key)
            model.pop(key, None)
        else:
            victim = policy.evict(busy.__contains__)
            assert victim not in busy
            if victim is not None:
                del model[victim]
            else:
                assert set(model) <= busy
        assert policy.bytes == sum(model.values())
        assert len(policy) == len(model)
