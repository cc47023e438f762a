"""Chunk ownership at cluster sizes: µs per lookup, table build time, balance, movement.

    python -m bench.ownership [--members 6,100,2000] [--chunks 200000]

For each cluster size: the time to build the table (once per membership change, off the
event loop), the time per owner lookup and per fallback-order lookup (3 owners), the
max/mean chunks per member over `--chunks` chunk keys (at 2,000 members and 200,000
chunks, 100 per member, most of that spread is the sampling's own), the max/mean table
slots per member (the scheme's own balance), and the share of chunks that move when one
member leaves.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from lota.cluster.ownership import Ownership, chunk_key


def measure(members: int, chunks: int) -> dict[str, float]:
    names = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:9000" for i in range(members)]
    keys = [chunk_key("data", f"shard-{i // 100:06d}.tar", '"e"', i % 100) for i in range(chunks)]
    started = time.perf_counter()
    ownership = Ownership(names)
    build = time.perf_counter() - started
    started = time.perf_counter()
    owners = [ownership.owner(k) for k in keys]
    lookup = (time.perf_counter() - started) / chunks
    sample = keys[: chunks // 10]
    started = time.perf_counter()
    for key in sample:
        ownership.owners(key, 3)
    fallback = (time.perf_counter() - started) / len(sample)
    counts = Counter(owners)
    mean = chunks / members
    slots = ownership.slots()
    without = Ownership(names[1:])
    moved = sum(1 for k, o in zip(keys, owners, strict=True) if without.owner(k) != o)
    return {
        "members": members,
        "table": ownership.size,
        "build_s": build,
        "lookup_us": lookup * 1e6,
        "owners3_us": fallback * 1e6,
        "max_over_mean": max(counts.values()) / mean,
        "slots_max_over_mean": max(slots.values()) / (ownership.size / members),
        "moved_share": moved / chunks,
        "leaver_share": counts[names[0]] / chunks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", default="6,100,2000")
    parser.add_argument("--chunks", type=int, default=200_000)
    args = parser.parse_args()
    print(
        f"{'members':>8} {'table':>8} {'build':>8} {'lookup':>9} {'3 owners':>9}"
        f" {'max/mean':>9} {'slots':>7} {'moved':>7} {'leaver':>7}"
    )
    for members in (int(m) for m in args.members.split(",")):
        r = measure(members, args.chunks)
        print(
            f"{r['members']:>8} {r['table']:>8} {r['build_s']:>7.2f}s {r['lookup_us']:>7.2f}µs"
            f" {r['owners3_us']:>7.2f}µs {r['max_over_mean']:>9.3f}"
            f" {r['slots_max_over_mean']:>7.3f} {r['moved_share']:>7.2%}"
            f" {r['leaver_share']:>7.2%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
