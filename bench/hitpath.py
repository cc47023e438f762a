"""What LOTA's Python spends on a small hit answered again, and on each part of it.

A presigned URL read again (a loader's next epoch) arrives as the same bytes, and
:meth:`lota.node.at_once.AtOnce.again` answers it before it is parsed: the request
remembered, its verdict and plan checked, the chunk's span found in the page cache, the
hit counted for eviction, admission and metrics. The wire benches (:mod:`bench.nginx`,
:mod:`bench.latency`) time that with the kernel's TCP, the load generator and a second
worker on the same two cores, and swing by a tenth from one run to the next. This times
the answer alone, in a loop, in one process: one LOTA node (one worker, SigV4, cache on)
with every object of a hot set read three times through it over HTTP first (and those
whose bytes are not at hand then, their pages taken back by a loaded machine, read again,
at most twice: ``read_again`` in the saved figures). Then each
part is replaced by nothing in turn, and the answer timed again: what is left out is
what the part costs. A hot set larger than the chunk descriptors kept (the process's
limit) reopens some files: how many per answer is printed.

What the answer does not include: reading the request (uvloop), writing the response
(``send`` and ``sendfile``, :func:`lota.zerocopy.send`) and the connection's keep-alive
(:meth:`lota.connections.GuardedRequestHandler.head_answered`); :mod:`bench.floor` gives
what a server doing only the system calls costs.

    python -m bench.hitpath                    # ~1 minute
    python -m bench.hitpath --sets 1000 --answers 50000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import uvloop

from bench.common import presigned_urls, save, stop_on_sigterm, table, write_small_objects
from bench.loadgen import LoadClient, get_request
from bench.origin import FileOrigin
from lota import config as configuration
from lota.cache import admission
from lota.cache.store import reader
from lota.node.at_once import AtOnce
from lota.node.build import build_node
from lota.testing.credentials import write_credentials

BUCKET = "bench-hitpath"

# Each part, as it is left out: what replaces it while the answers are timed again.
PARTS: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "admission count": lambda: mock.patch.object(admission.Admission, "hit_each", _nothing),
    "page-cache check": lambda: mock.patch.object(reader, "resident", _always),
    "accounting": lambda: mock.patch.object(AtOnce, "_send", _head_and_body),
}


def _nothing(*_: object) -> None:
    return None


def _always(*_: object) -> bool:
    return True


def _head_and_body(self: AtOnce, body: object, known: Any, *_: object) -> tuple[object, object]:
    return known.head, body


@contextmanager
def counting_opens() -> Iterator[list[int]]:
    """The files opened meanwhile (``os.open`` calls), in the one-item list yielded."""
    opened = [0]
    real = os.open

    def counted(*args: Any, **kwargs: Any) -> int:
        opened[0] += 1
        return real(*args, **kwargs)

    with mock.patch.object(os, "open", counted):
        yield opened


def time_answers(answer: Callable[[bytes], object], raws: list[bytes], count: int) -> float:
    """µs per call of `answer` over `raws` in turn, `count` calls in all (best of three)."""
    rounds = max(1, count // len(raws))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(rounds):
            for raw in raws:
                answer(bytes(raw))  # a new bytes object, as each request's arrives
        best = min(best, (time.perf_counter() - started) / (rounds * len(raws)))
    return best * 1e6


async def measure(size: int, answers: int, work: Path) -> dict[str, Any]:
    """One hot set of `size` objects: µs per answer, whole and without each part."""
    root = work / f"origin-{size}"
    keys = write_small_objects(root, BUCKET, size)
    with FileOrigin(root) as origin:
        credentials = write_credentials(work / "credentials.toml")
        config_path = work / f"lota-{size}.toml"
        config_path.write_text(
            'listen = "127.0.0.1:0"\nworkers = 1\n'
            f'[cache]\ndirs = ["{work / f"cache-{size}"}"]\nsize = "20GiB"\n'
            'revalidate_after = "1h"\n'
            f'[auth]\ncredentials = "{credentials}"\n'
            f'[regions.us-east]\nendpoint = "{origin.endpoint}"\n'
        )
        config = configuration.load(config_path, environ={})
        async with build_node(config) as node:
            url = await node.start()
            try:
                requests = [get_request(u) for u in presigned_urls(url, BUCKET, keys)]
                at_once = node.answers
                assert isinstance(at_once, AtOnce)
                raws = [r.data for r in requests]

                def answer(raw: bytes) -> object:
                    return at_once.again(raw, "127.0.0.1", True)

                client = LoadClient(32)
                try:  # a miss, then answered at once, then answered again from its bytes
                    for _ in range(3):
                        await client.run(requests, expect_size=64 * 1024)
                    # Read again what is not at hand (pages a loaded machine took back from
                    # the page cache meanwhile), at most twice.
                    read_again = 0
                    for _ in range(2):
                        unanswered = [r for r in requests if answer(r.data) is None]
                        if not unanswered:
                            break
                        read_again += len(unanswered)
                        await client.run(unanswered, expect_size=64 * 1024)
                finally:
                    client.close()
                answered = sum(answer(raw) is not None for raw in raws)
                row: dict[str, Any] = {"hot_set": size, "answered_again": answered / size}
                row["read_again"] = read_again
                with counting_opens() as opened:
                    row["us"] = time_answers(answer, raws, answers)
                row["opens_per_answer"] = opened[0] / (3 * max(1, answers // size) * size)
                for part, leave_out in PARTS.items():
                    with leave_out() if answered else nullcontext():
                        row[f"us without {part}"] = time_answers(answer, raws, answers)
                return row
            finally:
                await node.drain()
                await node.stop()


def report(rows: list[dict[str, Any]]) -> None:
    headers = ["hot set", "answered again", "µs per answer", "opens per answer"]
    headers += [f"{part} µs" for part in PARTS]
    lines = []
    for row in rows:
        cells = [f"{row['hot_set']:,}", f"{row['answered_again']:.0%}", f"{row['us']:.1f}"]
        cells.append(f"{row['opens_per_answer']:.2f}")
        cells += [f"{row['us'] - row[f'us without {part}']:.1f}" for part in PARTS]
        lines.append(cells)
    print("\nA small hit answered again, in process (one worker): µs per answer, and what")
    print("each part costs (the answer timed again without it)")
    print(table(headers, lines))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="1000,20000", help="hot set sizes")
    parser.add_argument("--answers", type=int, default=100_000, help="answers timed per run")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lota-hitpath-") as tmp:
        for size in (int(s) for s in args.sets.split(",")):
            rows.append(await measure(size, args.answers, Path(tmp)))
            print(rows[-1], flush=True)
    report(rows)
    save("hitpath", {"rows": rows})


if __name__ == "__main__":
    stop_on_sigterm()
    uvloop.run(main())
