"""Peak memory (RSS) of a LOTA node while many clients move 1 GiB objects through it.

Issue #2: memory must stay bounded whatever the object size. Two workloads, each against
one LOTA node (SigV4 auth, cache on) in front of an embedded origin with no added latency:

- default ("up+down"): ``--clients`` boto3 clients at once, each uploads its own object
  through LOTA (``upload_fileobj``: multipart, streamed from a patterned generator), then
  downloads it twice (first a MISS that fills the cache, then a HIT), streaming to a sink
  while hashing; every digest is checked. Target: peak RSS < 200 MiB with 8 clients (plus
  60 MiB per worker past the first).
- ``--mix``: ``--readers`` clients read ``--objects`` objects (reader r reads object
  r mod objects), half of them pre-warmed: hits, misses and coalesced misses at once.
  Target: peak RSS < 300 MiB with 16 readers (plus 60 MiB per worker past the first).

Peak RSS is the node's: the ``lota serve`` process and its worker processes (one per CPU
by default). Their VmHWM (reset
through ``clear_refs`` just before the measured phase when the kernel allows it) summed,
which bounds the node's peak from above (each process peaks at its own moment), and
cross-checked by sampling the sum of their VmRSS every 50 ms. The origin (moto) is
sampled too: it buffers whole objects, LOTA must not.

    python -m bench.memory                            # 8 clients, 1 GiB each, up+down
    python -m bench.memory --mix --readers 16          # 16 readers, hits and misses
    python -m bench.memory --size 64MiB --clients 2    # quick check
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig

from bench.common import Setup, lota_with_origin, peak_rss_mib, save, stop_on_sigterm, table
from bench.payload import (
    MiB,
    PatternReader,
    expected_digest,
    get_and_hash,
    human,
    load_average,
    parse_size,
)

BUCKET = "memory-bench"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def node_pids(pid: int) -> list[int]:
    """A ``lota serve`` process and its workers (its children; the supervisor starts them
    from its main thread, whose children the kernel lists)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:  # no CONFIG_PROC_CHILDREN: the process alone
        children = []
    return [pid, *map(int, children)]


def node_rss_mib(pid: int) -> float:
    """The RSS of the node whose ``lota serve`` process is `pid`, workers included."""
    total = 0.0
    for one in node_pids(pid):
        try:
            total += rss_mib(one)
        except OSError:  # a worker restarting
            continue
    return total


def reset_peak(pid: int) -> bool:
    """Reset each process's VmHWM to its current RSS (``echo 5 > /proc/PID/clear_refs``)."""
    try:
        for one in node_pids(pid):
            Path(f"/proc/{one}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class RssSampler:
    """Samples VmRSS of a few processes in a thread; keeps the maximum and a coarse timeline."""

    def __init__(self, pids: dict[str, int], interval: float = 0.05) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = dict.fromkeys(pids, 0.0)
        self.timeline: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> RssSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last_mark = -1.0
        while not self._stop.wait(self.interval):
            now = time.monotonic() - self._t0
            sample = {}
            for name, pid in self.pids.items():
                try:
                    sample[name] = node_rss_mib(pid) if name == "lota" else rss_mib(pid)
                except OSError:
                    continue
                self.peak[name] = max(self.peak[name], sample[name])
            if now - last_mark >= 1.0:
                self.timeline.append({"t": round(now, 1), **sample})
                last_mark = now


def transfer_config(args: argparse.Namespace) -> TransferConfig:
    config = TransferConfig(
        multipart_threshold=8 * MiB,
        multipart_chunksize=args.part_size,
        max_concurrency=args.part_threads,
    )
    # Parts read ahead from a non-seekable stream (s3transfer's default is 10).
    config.max_in_memory_upload_chunks = 2 * args.part_threads
    return config


def check(what: str, got: tuple[int, str, str], size: int, digest: str) -> str:
    count, seen, source = got
    if count != size or seen != digest:
        raise AssertionError(
            f"{what}: got {count} bytes digest {seen}, expected {size} bytes digest {digest}"
        )
    return source


def up_down(
    s3: Any, index: int, args: argparse.Namespace, gate: threading.Semaphore
) -> dict[str, Any]:
    """One client: upload its object through LOTA, then read it back twice.

    moto buffers whole objects (about 2.4 GiB of RSS to complete a 1 GiB multipart upload,
    1.3 GiB to serve one GET), so `gate` holds at most --origin-slots clients between
    "complete the upload" and "first read done (the MISS, LOTA's origin GET)". Parts,
    second reads and everything on the LOTA side still overlap freely.
    """
    key = f"client-{index}.bin"
    reader = PatternReader(index, args.size)
    held = threading.Event()

    def enter_gate(**_: Any) -> None:
        if not held.is_set():
            gate.acquire()
            held.set()

    s3.meta.events.register("before-call.s3.CompleteMultipartUpload", enter_gate)
    s3.meta.events.register("before-call.s3.PutObject", enter_gate)
    started = time.perf_counter()
    try:
        s3.upload_fileobj(reader, BUCKET, key, Config=transfer_config(args))
        uploaded = time.perf_counter()
        digest = reader.digest.hexdigest()
        sources = [check(key, get_and_hash(s3, BUCKET, key), args.size, digest)]
    finally:
        if held.is_set():
            gate.release()
    downloaded = time.perf_counter()
    sources.append(check(key, get_and_hash(s3, BUCKET, key), args.size, digest))
    return {
        "client": index,
        "upload_s": uploaded - started,
        "download1_s": downloaded - uploaded,
        "download2_s": time.perf_counter() - downloaded,
        "sources": sources,
    }


def read_one(s3: Any, reader: int, args: argparse.Namespace, digests: list[str]) -> dict[str, Any]:
    index = reader % args.objects
    started = time.perf_counter()
    got = get_and_hash(s3, BUCKET, f"object-{index}.bin")
    source = check(f"object-{index}", got, args.size, digests[index])
    return {"reader": reader, "object": index, "s": time.perf_counter() - started, "source": source}


def prepare_mix(setup: Setup, args: argparse.Namespace) -> list[str]:
    """Upload the objects straight to the origin, then warm half of them through LOTA."""
    direct, s3 = setup.client(direct=True), setup.client()
    direct.create_bucket(Bucket=BUCKET)

    def upload(index: int) -> None:
        reader = PatternReader(index, args.size)
        direct.upload_fileobj(reader, BUCKET, f"object-{index}.bin", Config=transfer_config(args))

    with ThreadPoolExecutor(args.origin_slots) as pool:
        list(pool.map(upload, range(args.objects)))
    digests = [expected_digest(i, args.size) for i in range(args.objects)]
    for index in range(args.warm):
        got = get_and_hash(s3, BUCKET, f"object-{index}.bin")
        check(f"warming object-{index}", got, args.size, digests[index])
    return digests


def workload(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    assert setup.node.proc is not None and setup.origin.pid is not None
    lota_pid, moto_pid = setup.node.proc.pid, setup.origin.pid
    digests: list[str] = []
    if args.mix:
        print(f"preparing {args.objects} objects at the origin, warming {args.warm}", flush=True)
        digests = prepare_mix(setup, args)
        clients = args.readers
    else:
        setup.client().create_bucket(Bucket=BUCKET)
        clients = args.clients
    s3s = [setup.client() for _ in range(clients)]
    before = node_rss_mib(lota_pid)
    hwm_reset = reset_peak(lota_pid)
    workers = args.workers or len(os.sched_getaffinity(0))  # what the target allows for
    print(f"LOTA RSS before the measured phase: {before:.1f} MiB ({workers} workers)", flush=True)
    started = time.perf_counter()
    with (
        RssSampler({"lota": lota_pid, "origin": moto_pid}) as sampler,
        ThreadPoolExecutor(clients) as pool,
    ):
        if args.mix:
            jobs = [pool.submit(read_one, s3s[r], r, args, digests) for r in range(clients)]
        else:
            gate = threading.Semaphore(args.origin_slots)
            jobs = [pool.submit(up_down, s3s[i], i, args, gate) for i in range(clients)]
        results = [job.result() for job in jobs]
    elapsed = time.perf_counter() - started
    metrics = {
        line.split()[0]: float(line.split()[1])
        for line in setup.node.metrics().splitlines()
        if line.startswith(("lota_origin_bytes_in_total", "lota_cache_"))
        and not line.startswith("lota_cache_fill_seconds")
    }
    return {
        "metrics": metrics,
        "lota_rss_before_mib": before,
        "lota_peak_vmhwm_mib": sum(peak_rss_mib(one) for one in node_pids(lota_pid)),
        "workers": workers,
        "vmhwm_reset": hwm_reset,
        "lota_peak_sampled_mib": sampler.peak["lota"],
        "origin_peak_sampled_mib": sampler.peak["origin"],
        "bench_client_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "elapsed_s": elapsed,
        "results": results,
        "timeline": sampler.timeline,
    }


def report(args: argparse.Namespace, out: dict[str, Any]) -> None:
    target = (300.0 if args.mix else 200.0) + 60.0 * (out["workers"] - 1)
    peak = out["lota_peak_vmhwm_mib"]
    results = out["results"]
    if args.mix:
        mode = f"{args.readers} readers of {args.objects} objects ({args.warm} pre-warmed)"
        moved = args.size * args.readers
        sources = Counter(r["source"] for r in results)
    else:
        mode = f"{args.clients} clients, each upload + 2 downloads"
        moved = args.size * args.clients * 3
        sources = Counter(s for r in results for s in r["sources"])
    origin_in = human(
        int(sum(v for k, v in out["metrics"].items() if k.startswith("lota_origin_bytes_in")))
    )
    print(
        f"\n== LOTA memory: {mode}, {human(args.size)} objects (sigv4, cache on), "
        f"{out['workers']} workers: the whole node's RSS"
    )
    print(
        table(
            ["measure", "value"],
            [
                ["LOTA RSS before (MiB)", out["lota_rss_before_mib"]],
                ["LOTA peak RSS, each process's VmHWM summed (MiB)", peak],
                [
                    "LOTA peak RSS, summed and sampled every 50 ms (MiB)",
                    out["lota_peak_sampled_mib"],
                ],
                ["target (MiB)", f"< {target:.0f}"],
                ["target met", "yes" if peak < target else "NO"],
                ["origin (moto) peak RSS, sampled (MiB)", out["origin_peak_sampled_mib"]],
                ["bench clients peak RSS (MiB)", out["bench_client_peak_mib"]],
                ["bytes moved through LOTA", human(moved)],
                ["wall time (s)", out["elapsed_s"]],
                ["aggregate (MB/s)", moved / out["elapsed_s"] / 1e6],
                ["x-lota-cache of downloads", dict(sources)],
                ["every digest verified", "yes"],
                ["LOTA origin bytes in (whole run)", origin_in],
            ],
        )
    )
    if not out["vmhwm_reset"]:
        print("(VmHWM could not be reset: it includes the set-up phase)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--clients", type=int, default=8, help="up+down clients")
    parser.add_argument("--mix", action="store_true", help="readers of hits and misses")
    parser.add_argument("--readers", type=int, default=16, help="readers in --mix")
    parser.add_argument("--objects", type=int, help="distinct objects in --mix (readers/2)")
    parser.add_argument("--warm", type=int, help="objects pre-warmed in --mix (objects/2)")
    parser.add_argument("--part-size", type=parse_size, default=8 * MiB)
    parser.add_argument("--part-threads", type=int, default=4, help="upload threads per client")
    parser.add_argument("--cache-size", default="40GiB")
    parser.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), help="LOTA's (default)"
    )
    parser.add_argument(
        "--origin-slots",
        type=int,
        default=3,
        help="clients at once in moto's whole-object steps (upload completion, first read)",
    )
    args = parser.parse_args()
    # moto gives a multipart object's composite CRC without S3's "-N" suffix, which boto3
    # (asking for checksums by default) would check against the whole object's bytes:
    # digests are checked here instead (see the README's Known limits).
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    args.objects = args.objects or max(1, args.readers // 2)
    args.warm = args.objects // 2 if args.warm is None else args.warm
    node = lota_with_origin(latency=0.0, cache_size=args.cache_size, workers=args.workers)
    async with node as setup:
        try:
            out = await asyncio.to_thread(workload, setup, args)
        except Exception:
            print("LOTA's log ends with:\n" + setup.node.log_tail(60))
            raise
    report(args, out)
    print(load_average())
    name = "memory_mix" if args.mix else "memory"
    path = save(name, {"args": {k: v for k, v in vars(args).items()}, **out})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
