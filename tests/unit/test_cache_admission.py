"""The admission rule in front of S3-FIFO: its sketch, its decisions, and deterministic
simulations of the store's decisions (lota.testing.cachesim) under epochs and Zipf."""

from __future__ import annotations

import random

import pytest

from lota.cache.admission import Admission, FrequencySketch
from lota.cache.eviction import S3FIFO
from lota.testing.cachesim import (
    SimulatedCache,
    epoch_hit_rate,
    epochs,
    zipf_hit_rate,
)


def read(sketch: FrequencySketch, fingerprint: int) -> None:
    sketch.add(fingerprint)
    sketch.reads += 1
    if sketch.reads >= sketch.period:
        sketch.halve()


def test_the_sketch_never_undercounts_and_halves_every_period() -> None:
    sketch = FrequencySketch(width=1024, period=100)
    for n in range(1, 6):
        for _ in range(n):
            read(sketch, n)
    assert [sketch.count(n) for n in range(1, 6)] >= [1, 2, 3, 4, 5]
    assert sketch.count(999) <= 1
    for _ in range(100 - 15):
        read(sketch, 12345)
    assert sketch.count(12345) == 15 // 2  # 85 reads, counted up to 15, then halved
    assert sketch.count(5) == 5 // 2


@pytest.mark.parametrize("times", [1, 2, 5, 20])
def test_raising_a_count_by_several_reads_at_once_is_as_many_reads_in_a_row(times: int) -> None:
    one_by_one, at_once = FrequencySketch(1024, 10_000), FrequencySketch(1024, 10_000)
    for sketch in (one_by_one, at_once):  # counters of 7 and 8 set apart first
        for fingerprint in [*range(50)] * 7 + [*range(0, 50, 3)]:
            sketch.add(fingerprint)
    for fingerprint in range(50):
        for _ in range(times):
            one_by_one.add(fingerprint)
        at_once.add(fingerprint, times)
    assert one_by_one._table == at_once._table


def test_a_hit_is_counted_before_its_chunk_is_a_victim_removed_or_the_period_ends() -> None:
    queues: S3FIFO[int] = S3FIFO()
    rule = Admission(queues, int, entries=8)  # a period of 4 x 1,024 reads
    for chunk in range(3):
        queues.insert(chunk, 1)
        rule.added(chunk)
    for _ in range(5):
        rule.hit(0, 1)
        rule.hit(1, 1)
    assert queues.tails() == (0, None)
    for _ in range(7):
        rule.read(100, 0)  # of no bytes: the victim, read last a byte ago, is not stale
    assert not rule.admits(100, full=True)  # 7 reads against the victim's 5: not 3 more
    rule.read(100, 0)
    assert rule.admits(100, full=True)  # 8 against 5
    for _ in range(3):
        rule.hit(0, 1)
    rule.removed(0)
    assert rule._sketch.count(0) == 5 + 3  # its count outlives it
    for _ in range(4 * 1024 - 21 - 1):  # 21 reads so far: one short of the period's end
        rule.hit(2, 1)
    assert rule._sketch.count(2) == 0  # held
    rule.hit(2, 1)
    assert rule._sketch.count(2) == 15 // 2  # counted up to 15, then halved


def test_hits_told_together_count_as_the_same_hits_told_one_by_one() -> None:
    """A store tells its hits a few at a time (hit_each): across periods' ends, halvings
    and the raising of held reads, the counts, the clock and the re-read intervals come
    out as if each hit had been told alone."""
    rng = random.Random(3)
    reads = [(rng.randrange(600), rng.choice((1, 7, 64))) for _ in range(3 * 4 * 1024 + 500)]
    rules = []
    for grouped in (False, True):
        queues: S3FIFO[int] = S3FIFO()
        rule = Admission(queues, int, entries=8)  # a period of 4 x 1,024 reads
        for chunk in range(600):
            queues.insert(chunk, 1)
            rule.added(chunk)
        at = 0
        while at < len(reads):
            group = reads[at : at + (rng.randrange(1, 80) if grouped else 1)]
            if grouped:
                rule.hit_each([key for key, _ in group], [size for _, size in group])
            else:
                rule.hit(*group[0])
            at += len(group)
        for chunk in range(600):
            rule.removed(chunk)  # its held reads raised
        rules.append(rule)
    alone, together = rules
    assert alone._sketch._table == together._sketch._table
    assert alone._sketch.reads == together._sketch.reads > 0
    assert alone._clock == together._clock == sum(size for _, size in reads)
    assert alone._intervals == together._intervals is not None


def test_near_a_periods_end_held_reads_are_raised_a_few_per_read_and_few_wait_for_its_end() -> None:
    queues: S3FIFO[int] = S3FIFO()
    rule = Admission(queues, int, entries=8)
    period = rule._sketch.period  # 4 x 1,024 reads
    most = 0
    for n in range(period - 1):
        rule.hit(n % 3000, 1)  # 3,000 keys: reads 0..1,094 twice
        most = max(most, len(rule._held_reads))
    assert most == 3000  # all held until more were held than 4 x the reads left
    assert len(rule._held_reads) <= 5  # the rest raised already, a few per read
    rule.hit(2999, 1)  # the period ends: counted, then halved
    assert not rule._held_reads
    assert all(rule._sketch.count(k) >= 2 // 2 for k in (0, 1094, 2999))  # read twice, halved


def test_reads_held_when_the_sketch_grows_are_dropped_with_the_counts_it_had() -> None:
    queues: S3FIFO[int] = S3FIFO()
    rule = Admission(queues, int, entries=1)  # grows past 2 x 1,024 chunks
    for _ in range(5):
        rule.hit(-1, 1)
    for chunk in range(2 * 1024 + 1):
        rule.added(chunk)
    rule.removed(-1)
    assert rule._sketch.count(-1) == 0  # counted in the sketch replaced, as before


# The period (4 x 1,024 reads) ends amid the reads told: none, those of 1000, of 60.
@pytest.mark.parametrize("before", [100, 4 * 1024 - 10, 4 * 1024 - 61])
@pytest.mark.parametrize("times", [1, 25])
def test_reads_told_at_once_count_as_as_many_in_a_row(before: int, times: int) -> None:
    """A sibling worker tells a chunk's owner of its reads in batches: n hits of a cached
    chunk (or n reads of one not cached) at once count as n in a row, a period's end
    between them included (the re-read intervals too, when nothing else was read since
    the chunk's last read)."""
    rules = []
    for at_once in (False, True):
        queues: S3FIFO[int] = S3FIFO()
        rule = Admission(queues, int, entries=8)  # a period of 4 x 1,024 reads
        for n in range(before):
            rule.hit(n % 50, 10)
        if at_once:
            rule.read(1000, 10, 25)
        else:
            for _ in range(25):
                rule.read(1000, 10)
        for key in (7, 60):
            rule.hit(key, 10)  # then `times` more, with no other read between
            if at_once:
                rule.hits(key, 10, times)
            else:
                for _ in range(times):
                    rule.hit(key, 10)
        for key in [*range(50), 60]:
            rule.removed(key)  # raises what each holds
        rules.append(rule)
    one_by_one, at_once_rule = rules
    assert one_by_one._sketch._table == at_once_rule._sketch._table
    assert one_by_one._sketch.reads == at_once_rule._sketch.reads
    assert one_by_one._clock == at_once_rule._clock
    assert one_by_one._intervals == pytest.approx(at_once_rule._intervals)
    assert at_once_rule._sketch.count(60) > 0 and at_once_rule._sketch.count(1000) > 0


def reread() -> tuple[S3FIFO[int], Admission[int]]:
    """Chunks 0..7 of one byte each, cached (as after a restart: no reads known) and read
    twice in order: every one has a count of 2, the mean re-read interval is 8 bytes."""
    queues: S3FIFO[int] = S3FIFO()
    rule = Admission(queues, int, entries=8)
    for chunk in range(8):
        queues.insert(chunk, 1)
    for chunk in [*range(8), *range(8)]:
        rule.hit(chunk, 1)
    return queues, rule


def test_below_the_high_watermark_every_fill_is_kept() -> None:
    _, rule = reread()
    assert rule.admits(100, full=False)


def test_a_chunk_read_as_often_as_the_victim_is_refused_and_the_tails_get_another_turn() -> None:
    queues, rule = reread()
    rule.read(100, 1)
    rule.read(100, 1)
    assert queues.tails() == (0, None)
    assert not rule.admits(100, full=True)  # two reads, as the victim
    assert queues.tails() == (1, None)


def test_a_chunk_with_three_reads_more_than_the_victim_is_kept() -> None:
    _, rule = reread()
    for _ in range(4):
        rule.read(100, 1)
    assert not rule.admits(100, full=True)  # four reads, the victim two
    rule.read(100, 1)
    assert rule.admits(100, full=True)


@pytest.mark.parametrize(("since", "stale"), [(16, False), (17, True)])
def test_a_victim_unread_for_twice_the_mean_reread_interval_is_stale(
    since: int, stale: bool
) -> None:
    queues, rule = reread()
    rule.read(200, since - 7)  # 0 was last read 7 bytes before the end of reread()
    assert queues.tails() == (0, None)
    assert rule.admits(100, full=True) is stale


# -- simulations: the store's decisions, LOTA's own policy classes, fixed seeds -----------


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_epochs_over_a_dataset_larger_than_the_cache_hit_the_cache_fraction(
    fraction: float,
) -> None:
    """5 epochs over 5,000 chunks, each in a new order; hit rate from the second on."""
    assert epoch_hit_rate("admission", 5000, fraction) > 0.9 * fraction


@pytest.mark.parametrize("workers", [2, 8])
def test_a_chunk_owner_told_of_its_siblings_hits_keeps_the_cache_fraction(workers: int) -> None:
    """Among several workers, a chunk's owner hears of its siblings' hits when they tell
    (lota.workers.news, every 1,000 reads here): epochs still hit the cache's fraction;
    untold, the owner churns."""
    rates = {}
    for told in (1000, None):
        cache = SimulatedCache(2500, workers=workers, told_every=told)
        hits = [0] * 5
        for epoch, chunk in epochs(5000, 5):
            hits[epoch] += cache.read(chunk)
        rates[told] = sum(hits[1:]) / (4 * 5000)
    assert rates[1000] > 0.9 * 0.5
    assert rates[None] < rates[1000] - 0.01


def test_epochs_churn_s3fifo_without_admission() -> None:
    """The scenario above is not one plain S3-FIFO passes."""
    assert epoch_hit_rate("s3fifo", 5000, 0.5) < 0.3


@pytest.mark.parametrize("alpha", [0.8, 1.0, 1.2])
def test_zipf_hit_rate_stays_within_a_point_of_s3fifo(alpha: float) -> None:
    args = (20_000, 0.1, alpha, 60_000)
    assert zipf_hit_rate("admission", *args) > zipf_hit_rate("s3fifo", *args) - 0.01


def test_a_small_hot_object_gets_in_while_epochs_keep_the_cache_full() -> None:
    cache = SimulatedCache(2500)
    hot = [10**6 + n for n in range(20)]
    hits = reads = 0
    for n, (epoch, chunk) in enumerate(epochs(5000, 6)):
        cache.read(chunk)
        if epoch >= 2 and n % 25 == 0:
            hit = cache.read(hot[n % len(hot)])
            if epoch >= 4:
                hits += hit
                reads += 1
    assert hits / reads > 0.95


def test_small_files_read_all_the_time_do_not_make_the_dataset_look_stale() -> None:
    """As many reads of 50 small files as of the dataset: the dataset keeps its share."""
    cache = SimulatedCache(2500)
    hot = [10**6 + n for n in range(50)]
    hits = [0] * 5
    for n, (epoch, chunk) in enumerate(epochs(5000, 5)):
        hits[epoch] += cache.read(chunk)
        cache.read(hot[n * 7 % len(hot)])
    assert min(hits[1:]) / 5000 > 0.9 * (2500 - 50) / 5000


def test_a_finished_dataset_makes_way_for_the_next() -> None:
    cache = SimulatedCache(2500)
    for _, chunk in epochs(5000, 3, seed=9, first=10**6):
        cache.read(chunk)
    hits = [0] * 6
    for epoch, chunk in epochs(5000, 6):
        hits[epoch] += cache.read(chunk)
    assert hits[-1] / 5000 > 0.45
