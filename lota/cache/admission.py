"""Which chunks a full cache keeps: an admission rule in front of S3-FIFO, as a pure class
(no I/O, no clock).

Why: S3-FIFO (:mod:`lota.cache.eviction`) shrugs off a scan read once, but not a dataset
larger than the cache read over and over in a new order each epoch, the pattern of
training. Every miss is kept and evicts a chunk that will be read later in the same
epoch, so the cache churns: holding half of the dataset, it hits 18% of the reads from
the second epoch on (LRU: 14%), where keeping any fixed half would hit half (``python -m
bench.admission``). So when keeping a chunk means evicting another (the store is at its
high watermark; below it every fill is kept), the chunk must earn its place:

- **More reads than the victim** (TinyLFU: Einziger, Friedman and Manes, "TinyLFU: A Highly
  Efficient Cache Admission Policy", ACM ToS 2017). A count-min sketch counts the reads of
  every chunk, held or not, and halves its counters every few cache-fulls of reads so that
  it follows the present. A chunk is kept if it has at least three reads more than the
  chunk eviction would take next (the victim). Its count is taken *before* the read
  that brings it: a chunk of a dataset read once an epoch then counts as many reads as a
  cached one, whatever the point of the epoch, and a tie keeps the cached chunk. So the
  chunks cached during the first epoch stay, and every later epoch hits the cache's share
  of the dataset. A small object read again and again outcounts dataset chunks and gets
  in. A lead of three absorbs the sketch's overcounts and a dataset chunk read twice
  by chance in one counting period (at the end of an epoch and the start of the next):
  a chunk kept when the cache is full evicts a batch (down to the low watermark), so one
  false win costs a twentieth of the cache.
- **Or the victim is stale**: not read for twice the mean interval between two reads of
  a cached chunk. The interval is measured in bytes read through the cache, so that idle
  hours age nothing, and each cached chunk weighs the same in the mean however often it
  is read, so that a few small files read all the time do not make a dataset's chunks
  look stale. Without this, a finished dataset's chunks, counted often and then never
  read again, would keep the next dataset out until their counts decayed. Until a cached
  chunk has been read twice there is no interval, and frequency alone decides (a cache
  that churned from the start would measure the short intervals of its churn and keep
  churning). Each refusal moves the oldest chunk of both S3-FIFO queues to their heads,
  counts unchanged (the second chance S3-FIFO's main queue gives a read chunk), so the
  rule looks at every cached chunk in turn and finds the stale ones wherever they are.

Why not a hash threshold (keep the chunks whose hash falls below a level set from the
budget and the dataset's size): the level needs the dataset's size, which shows only in
how chunks come back. Two such levels were tried while building this (one lowered when
kept chunks were evicted and raised when the cache had room, one set from how far apart
refused chunks came back): both took epochs to settle, replacing the first epoch's
chunks meanwhile, and stayed well below this rule. A tie that keeps the cached chunk needs
no estimate: the first epoch's chunks are the subset kept.

A node of a cluster counts what it serves: its own chunks (read by its clients or its
peers) and the chunks of other nodes it relays; it keeps only what its store is asked to.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from lota.cache.eviction import S3FIFO

K = TypeVar("K", bound=Hashable)

_U64 = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads consecutive fingerprints apart
_MAX_COUNT = 15
# Held reads are raised, a few per read, once more keys are held than this many times the
# reads left in the period (Admission._raise_some): the later they are, the more of a key's
# reads are raised at once.
_DRAIN = 4
_HALF = bytes(n // 2 for n in range(256))


class FrequencySketch:
    """Approximate read counts (0..15) of many keys in one byte array: a count-min sketch,
    four counters per key found by double hashing, raised by conservative update (only the
    smallest ones), all halved every `period` reads (the caller counts them in `reads`, and
    halves: :meth:`halve`). It overcounts, never undercounts."""

    def __init__(self, width: int, period: int) -> None:
        size = 1 << max(10, (width - 1).bit_length())
        self._table = bytearray(size)
        self._mask = size - 1
        self.period = max(1, period)
        self.reads = 0
        """Reads counted since the last halving."""

    def _slots(self, fingerprint: int) -> tuple[int, int, int, int]:
        h = (fingerprint * _MIX) & _U64
        step = (h >> 32) | 1
        mask = self._mask
        return h & mask, (h + step) & mask, (h + 2 * step) & mask, (h + 3 * step) & mask

    def count(self, fingerprint: int) -> int:
        table = self._table
        a, b, c, d = self._slots(fingerprint)
        return min(table[a], table[b], table[c], table[d])

    def add(self, fingerprint: int, times: int = 1) -> None:
        """Raise the key's counters by `times` reads, as `times` conservative updates in a
        row would: each to the smallest plus `times` (at most 15) if it is lower. Its reads
        are counted apart (`reads`)."""
        table = self._table
        a, b, c, d = self._slots(fingerprint)
        ta, tb, tc, td = table[a], table[b], table[c], table[d]
        top = min(ta, tb, tc, td, _MAX_COUNT - times) + times
        if ta < top:
            table[a] = top
        if tb < top:
            table[b] = top
        if tc < top:
            table[c] = top
        if td < top:
            table[d] = top

    def halve(self) -> None:
        """Halve every counter (the present weighs as much as all the past), and start a
        new period."""
        self._table = bytearray(self._table.translate(_HALF))
        self.reads = 0


class Admission(Generic[K]):
    """The admission rule over the keys `queues` holds (see the module docstring).

    Keys are cached chunks; a chunk is counted by ``fingerprint(key)``, an int naming the
    chunk's contents (a chunk filled again after its eviction is a new key with the same
    fingerprint). `entries` is how many chunks the cache is expected to hold: the sketch
    has 16 counters per entry and halves them every 4 entries' worth of reads (it grows
    with the cache). `lead`: how many reads more than the victim a chunk needs;
    `stale_after`: a victim unread for this many mean re-read intervals is stale.
    """

    def __init__(
        self,
        queues: S3FIFO[K],
        fingerprint: Callable[[K], int],
        entries: int,
        *,
        lead: int = 3,
        stale_after: float = 2.0,
    ) -> None:
        self._queues = queues
        self._fingerprint = fingerprint
        self._entries = max(1024, entries)
        self._sketch = FrequencySketch(16 * self._entries, 4 * self._entries)
        self._lead = lead
        self._stale_after = stale_after
        self._clock = 0
        """Bytes read through the cache so far: the time chunks age in."""
        self._read_at: dict[K, int] = {}
        # Reads of cached chunks not yet raised in the sketch (hit): raised before their
        # count is asked (as a victim's), before they are removed and before a halving, all
        # of a chunk's at once, as that many updates in a row would (FrequencySketch.add).
        self._held_reads: dict[K, int] = {}
        # Moving means of the intervals between two reads of a cached chunk, and of their
        # squares; None until a chunk is read again.
        self._intervals: tuple[float, float] | None = None

    def hit(self, key: K, size: int) -> None:
        """A cached chunk of `size` bytes was read."""
        self.hit_each((key,), (size,))

    def hit_each(self, keys: Sequence[K], sizes: Sequence[int]) -> None:
        """Cached chunks were read, in turn: each of `keys`, of the size at the same place
        in `sizes`; as many :meth:`hit` calls in a row. Written out as one loop: this runs
        for every hit."""
        held, sketch, read_at = self._held_reads, self._sketch, self._read_at
        period, clock = sketch.period, self._clock
        learnt = self._intervals is not None
        mean, square = self._intervals or (0.0, 0.0)
        for key, size in zip(keys, sizes, strict=True):
            # Its count is raised later, by all of its reads since at once (_held_reads):
            # finding its sketch counters from its fingerprint cost a fifth of the answer to
            # a small hit (python -m bench.hitpath).
            held[key] = held.get(key, 0) + 1
            reads = sketch.reads = sketch.reads + 1  # _count_read(), written out
            if reads >= period or len(held) > _DRAIN * (period - reads):
                self._raise_some()
            clock += size
            last = read_at.get(key)
            read_at[key] = clock
            if last is None:
                continue
            # Learn the interval since its last read. A chunk read n times as often gives n
            # times as many, each 1/n as long: weighting each by its length makes every
            # cached chunk weigh the same.
            d = float(clock - last)
            if learnt:
                mean += (d - mean) / 256
                square += (d * d - square) / 256
            else:
                mean, square, learnt = d, d * d, True
        self._clock = clock
        if learnt:
            self._intervals = (mean, square)

    def hits(self, key: K, size: int, times: int) -> None:
        """`times` reads of cached chunk `key` heard of at once (a sibling worker served
        them, and told of them together): counted as that many hits coming evenly since its
        last read (with no other read between, exactly as they would have been; a chunk
        not read before learns no interval from them)."""
        if times <= 1:
            if times == 1:
                self.hit(key, size)
            return
        held, sketch = self._held_reads, self._sketch
        left = times
        while left:  # the reads after a period's end are raised after its halving
            step = min(left, max(1, sketch.period - sketch.reads))
            held[key] = held.get(key, 0) + step
            self._count_read(step)
            left -= step
        clock = self._clock = self._clock + times * size
        last = self._read_at.get(key)
        self._read_at[key] = clock
        if last is None:
            return
        d = (clock - last) / times
        keep = (1 - 1 / 256) ** times  # what `times` updates of the means leave of them
        mean, square = self._intervals or (d, d * d)
        self._intervals = (d + (mean - d) * keep, d * d + (square - d * d) * keep)

    def read(self, fingerprint: int, size: int, times: int = 1) -> None:
        """A client read a chunk that is not cached (it followed a fill, or it was relayed
        from the source or another node), `times` times. Fetching a chunk ahead is not a
        read."""
        sketch, left = self._sketch, times
        while left:  # the reads after a period's end are counted after its halving
            step = min(left, max(1, sketch.period - sketch.reads))
            sketch.add(fingerprint, step)
            self._count_read(step)
            left -= step
        self._clock += times * size

    def _raise_held(self, key: K) -> None:
        """Raise `key`'s count by the reads it has had since it was last raised."""
        times = self._held_reads.pop(key, 0)
        if times:
            self._sketch.add(self._fingerprint(key), times)

    def _count_read(self, times: int = 1) -> None:
        """Count reads in the period (then, near or at its end, :meth:`_raise_some`)."""
        sketch = self._sketch
        sketch.reads += times
        if sketch.reads >= sketch.period or len(self._held_reads) > _DRAIN * (
            sketch.period - sketch.reads
        ):
            self._raise_some()

    def _raise_some(self) -> None:
        """A read was just counted. Near the period's end (more keys held than _DRAIN
        times the reads left in it) held keys are raised a few per read, as many as keep
        their number under that bound (each read holds one more at most), so that only a
        few are left at the end; at the end, every held read is raised, then every count
        halved. So the halving comes after the same reads as if each had been raised as it
        came, and no read waits for more than a few keys to be raised (a cache of a
        million chunks may hold as many)."""
        sketch, held, fingerprint = self._sketch, self._held_reads, self._fingerprint
        left = sketch.period - sketch.reads
        if left <= 0:
            for key, times in held.items():
                sketch.add(fingerprint(key), times)
            held.clear()
            sketch.halve()
            return
        for _ in range(min(len(held), len(held) // left + 1)):
            key, times = held.popitem()
            sketch.add(fingerprint(key), times)

    def admits(self, fingerprint: int, *, full: bool) -> bool:
        """Whether to keep a chunk about to be filled, asked before its read is counted.
        `full`: keeping it means evicting (the store is at its high watermark)."""
        if not full:
            return True
        victim, other = self._queues.tails()
        if victim is None or self._stale(victim) or self._stale(other):
            return True
        self._raise_held(victim)
        if (
            self._sketch.count(fingerprint)
            >= self._sketch.count(self._fingerprint(victim)) + self._lead
        ):
            return True
        self._queues.spare()
        return False

    def added(self, key: K) -> None:
        """`key` was just filled: it ages from now."""
        self._read_at[key] = self._clock
        if len(self._read_at) > 2 * self._entries:
            self._entries = len(self._read_at)
            self._sketch = FrequencySketch(16 * self._entries, 4 * self._entries)
            self._held_reads.clear()  # counted in the sketch replaced, as they would have been

    def removed(self, key: K) -> None:
        self._raise_held(key)  # its fingerprint's count outlives it (filled again later)
        self._read_at.pop(key, None)

    def _stale(self, key: K | None) -> bool:
        if key is None or self._intervals is None:
            return False
        mean, square = self._intervals
        age = self._clock - self._read_at.get(key, 0)
        return age * mean > self._stale_after * square
