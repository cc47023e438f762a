"""Which node of the cluster owns a chunk: a Maglev lookup table over the members.

Every chunk of every object version has one owner, chosen by its key — (bucket, key,
ETag, chunk index), hashed with xxh64, never Python's salted ``hash()``, so every node
and every process agrees — so the chunks of one object, even one uploaded in a single
PUT, spread over all the nodes.

The scheme is Maglev hashing (Eisenbud et al., NSDI 2016): each member walks its own
permutation of a table of ``M`` slots (an offset and a step from the hash of its name)
and the members take turns claiming the next free slot of theirs, until the table is
full. Then:

- a lookup is one hash and one index: about a microsecond at any member count (the
  rendezvous scheme costs one hash per member, 2,000 of them per chunk at 2,000 nodes);
- each member holds ``M/n`` slots, give or take one, so chunks spread as evenly as
  hashing allows (``M`` is at least 100 slots per member);
- when a member leaves or joins, most slots keep their owner (the others move to or from
  it, and a few more shift), and the table depends only on the *set* of members, not on
  the order they are listed in.

``M`` is the first prime of :data:`TABLE_SIZES` holding 100 slots per member, so it
changes (and ownership reshuffles) only when the cluster crosses 655 or 2,621 members.

The next owners to try when the owner cannot answer come from the same table, at
positions given by the key hashed with further seeds: a fallback order every node agrees
on, spread over the members rather than always the owner's neighbour.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

# Primes: ~100 slots per member up to 655, 2,621 and 10,485 members.
TABLE_SIZES = (65_537, 262_139, 1_048_573)
SLOTS_PER_MEMBER = 100
# Seeds for the hashes of a member's name (its offset and its step in the table).
_OFFSET_SEED, _STEP_SEED = 0x4C4F5441, 0x4D41474C
# Seeds of the worker processes' hashes (worker_of): _WORKER_SEED + the worker's number.
_WORKER_SEED = 0x574F524B


def chunk_key(bucket: str, key: str, etag: str, index: int) -> bytes:
    """The bytes a chunk's owner is chosen by: the same on every node, for one version."""
    return f"{bucket}\0{key}\0{etag}\0{index}".encode("utf-8", "surrogateescape")


def object_key(bucket: str, key: str) -> bytes:
    """The bytes the worker an object's metadata lives with is chosen by (any version)."""
    return f"{bucket}\0{key}".encode("utf-8", "surrogateescape")


def table_size(members: int) -> int:
    """The table size for a cluster of `members` nodes."""
    for size in TABLE_SIZES:
        if size >= SLOTS_PER_MEMBER * members:
            return size
    raise ValueError(f"a cluster of {members} members is larger than LOTA's tables")


class Ownership:
    """Who owns each chunk, among a fixed set of members (build a new one when it changes)."""

    def __init__(self, members: Iterable[str]) -> None:
        self.members: tuple[str, ...] = tuple(sorted(set(members)))
        if not self.members:
            raise ValueError("a cluster needs at least one member")
        self.size = table_size(len(self.members))
        self._table = _populate(self.members, self.size)

    def owner(self, key: bytes) -> str:
        """The member that owns the chunk with this :func:`chunk_key`."""
        return self.members[self._table[xxhash.xxh64_intdigest(key) % self.size]]

    def owners(self, key: bytes, count: int) -> list[str]:
        """Up to `count` distinct members in the order to ask them: the owner first."""
        wanted = min(count, len(self.members))
        found = [self.owner(key)]
        seed = 1
        while len(found) < wanted:
            slot = xxhash.xxh64_intdigest(key, seed=seed) % self.size
            candidate = self.members[self._table[slot]]
            if candidate not in found:
                found.append(candidate)
            seed += 1
            if seed > 64 * wanted:  # a pathological table: take the rest in name order
                found.extend(m for m in self.members if m not in found)
                return found[:wanted]
        return found

    def slots(self) -> dict[str, int]:
        """How many slots of the table each member holds."""
        counts = dict.fromkeys(self.members, 0)
        for index in self._table:
            counts[self.members[index]] += 1
        return counts


def _populate(members: tuple[str, ...], size: int) -> list[int]:
    """Maglev's population: members take turns claiming the next free slot of their own
    permutation of the table (offset + j * step, modulo the prime `size`)."""
    offsets = [xxhash.xxh64_intdigest(m.encode(), seed=_OFFSET_SEED) % size for m in members]
    steps = [xxhash.xxh64_intdigest(m.encode(), seed=_STEP_SEED) % (size - 1) + 1 for m in members]
    tried = [0] * len(members)
    table = [-1] * size
    filled = 0
    while True:
        for i in range(len(members)):
            offset, step, j = offsets[i], steps[i], tried[i]
            slot = (offset + j * step) % size
            while table[slot] >= 0:
                j += 1
                slot = (offset + j * step) % size
            table[slot] = i
            tried[i] = j + 1
            filled += 1
            if filled == size:
                return table


def worker_of(key: bytes, workers: int) -> int:
    """Which of a node's `workers` worker processes owns the chunk with this
    :func:`chunk_key`: rendezvous hashing (the highest xxh64 of the key seeded with each
    worker's number), so going from N to N+1 workers moves 1/(N+1) of the chunks."""
    if workers <= 1:
        return 0
    # Written out (not max() with a key): this runs for every hit on another worker's chunk.
    owner = top = 0
    for worker in range(workers):
        mark = xxhash.xxh64_intdigest(key, _WORKER_SEED + worker)
        if mark > top:
            owner, top = worker, mark
    return owner
