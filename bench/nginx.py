"""LOTA against nginx's proxy_cache, hits only, on the same machine in one run.

Both in front of the same origin (:mod:`bench.origin`: files sent with sendfile):

- LOTA: ``lota serve`` with its default workers (one per CPU here), SigV4 on, one cache;
- nginx (Debian's package): 2 worker processes, ``proxy_cache`` with ``slice 8m`` (the
  cache key is the path and the slice, so a presigned URL's query does not split it),
  sendfile on, no access log. The bench writes its config and starts it.

Every object is read once through each before timing (a cold fill, untimed). Then, with
the lean load generator (:mod:`bench.loadgen`, in its own process): 64 KiB hits at
concurrency 16 and 64, over hot sets of 1,000 and 20,000 distinct objects, each read
through its own presigned SigV4 URL (nginx gets the same URLs); each system reads its
hot set once more, untimed, right before its cells of that size, so that both are timed
on a hot set, not one whose files sat idle longer than the other's (a machine may page
out file pages idle for a minute: this one does, DAMON's proactive reclaim, and the fills
and the smaller set's cells take longer than that); and 1 GiB hits with one
and four ``curl`` clients. Each measurement is made ``--runs`` times (3), LOTA and nginx
alternated in each round of a 64 KiB cell, and the medians are reported: a cell lasts about
a second, and on a shared machine one second's share of the cores can swing a ratio by a
fifth. Printed: the scheduling policy LOTA's workers ran under (``scheduling``, as read off a
worker); req/s, p50/p99, GB/s for both, and LOTA / nginx (each round's too); the
CPU each spent per request, and the load generator's (the two cores are shared: what
one server's answers cost the load generator to read is taken from that server); how busy
the load generator was (its CPU time over the cell's wall time: near 100%, it bounds the
cell, not the server) and how long it was ready to run but waited for a core (the
kernel's run delay, over the cell's wall time: the server's processes held both cores,
and no request was sent meanwhile), what share of the two cores sat idle (over the cell, its
untimed warm-up of up to 256 requests included), and what share of the times LOTA's
workers looked found their event loops more than 5 ms late (``lota_event_loop_lag_seconds``:
a step holding the loop, or the worker off the CPU; either delays the worker's requests;
but for the late looks the bench's own first scrape of the cell makes, measured idle).

    python -m bench.nginx                 # ~4 minutes
    python -m bench.nginx --requests 5000 --sets 1000
    python -m bench.nginx --catalog --sets 1000   # LOTA with a catalog, as write acceleration has
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    percentiles,
    presigned_urls,
    save,
    stop_on_sigterm,
    table,
    write_small_objects,
)
from bench.latency import run_cell
from bench.loadgen import get_request
from bench.origin import FileOrigin
from bench.throughput import streams
from lota.node.serve import policy_of
from lota.testing.credentials import write_credentials
from lota.testing.processes import LotaProcess, free_port

KiB, MiB, GiB = 1024, 1024 * 1024, 1024**3
BUCKET = "bench-nginx"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

NGINX_CONF = """
{user}
worker_processes 2;
daemon off;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    proxy_cache_path {root}/cache levels=1:2 keys_zone=lota:64m max_size=20g
                     inactive=1d use_temp_path=off;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            slice 8m;
            proxy_cache lota;
            proxy_cache_key $uri$slice_range;
            proxy_set_header Range $slice_range;
            proxy_cache_valid 200 206 1d;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://origin;
        }}
    }}
}}
"""


class Nginx:
    """nginx with a proxy cache in front of `origin_port`, in its own directory."""

    def __init__(self, root: Path, origin_port: int) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        self.conf = root / "nginx.conf"
        user = "user root;" if os.geteuid() == 0 else ""  # else its workers cannot write here
        self.conf.write_text(
            NGINX_CONF.format(user=user, root=root, origin_port=origin_port, port=self.port)
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Nginx:
        self.proc = subprocess.Popen([NGINX, "-c", str(self.conf), "-p", str(self.root)])
        deadline = time.monotonic() + 10
        try:
            while not _answers(self.port):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError((self.root / "error.log").read_text()[-2000:])
                time.sleep(0.05)
        except BaseException:  # failed, or interrupted (SIGTERM): not left running
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    def pids(self) -> list[int]:
        """The master and its workers (for their CPU time)."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return [self.proc.pid, *map(int, children.split())]


def _answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), 0.2):
            return True
    except OSError:
        return False


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def machine_times() -> tuple[int, int]:
    """The machine's idle time (idle and waiting for I/O) and its whole time so far, over
    all cores, in clock ticks (``/proc/stat``)."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def idle_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the cores' time that was idle between two :func:`machine_times`."""
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def lota_pids(node: LotaProcess) -> list[int]:
    assert node.proc is not None
    pid = node.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [pid, *map(int, children.split())]


def write_objects(root: Path, count: int) -> list[str]:
    keys = write_small_objects(root, BUCKET, count, "small")
    big = root / BUCKET / "big.bin"
    with big.open("wb") as f:
        chunk = os.urandom(16 * MiB)
        for _ in range(GiB // len(chunk)):
            f.write(chunk)
    return keys


class LoopLooks:
    """How many times LOTA's workers looked at how late their loops run, and how many of
    those found them more than 5 ms late (``lota_event_loop_lag_seconds``), so far. A
    scrape makes some late looks itself: the worker answering it adds its siblings'
    metrics up, holding its loop; :meth:`late_share` takes what one scrape makes, measured
    idle (:meth:`calibrate`), off a cell's count."""

    def __init__(self, node: LotaProcess) -> None:
        self._node = node
        self.per_scrape = 0.0

    def __call__(self) -> tuple[float, float]:
        text = self._node.metrics()
        looks = re.search(r"^lota_event_loop_lag_seconds_count (\S+)$", text, re.M)
        prompt = re.search(r'^lota_event_loop_lag_seconds_bucket\{le="0.005"\} (\S+)$', text, re.M)
        if looks is None or prompt is None:
            raise RuntimeError("LOTA's metrics have no lota_event_loop_lag_seconds")
        return float(looks.group(1)), float(looks.group(1)) - float(prompt.group(1))

    def calibrate(self) -> None:
        """Late looks one scrape makes on an idle node: the median of five."""
        made = []
        before = self()
        for _ in range(5):
            time.sleep(0.2)
            after = self()
            made.append(after[1] - before[1])
            before = after
        self.per_scrape = sorted(made)[2]

    def late_share(self, before: tuple[float, float], after: tuple[float, float]) -> float:
        """Of the looks between two scrapes, the share more than 5 ms late, but for those
        the first scrape made."""
        return max(0.0, after[1] - before[1] - self.per_scrape) / max(after[0] - before[0], 1)


async def cell(
    pool: ProcessPoolExecutor,
    urls: list[str],
    count: int,
    concurrency: int,
    pids: list[int],
    looks: LoopLooks | None = None,
) -> dict[str, Any]:
    """`looks`: those of the server measured, if it is LOTA."""
    warm = [get_request(u) for u in urls[: max(2 * concurrency, 256)]]
    timed = [get_request(urls[i % len(urls)]) for i in range(count)]
    looked = looks() if looks else None  # before the CPU times: a scrape costs LOTA some
    cpu, machine = cpu_seconds(pids), machine_times()
    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(pool, run_cell, warm, timed, concurrency, 64 * KiB)
    used = cpu_seconds(pids) - cpu
    idle = idle_share(machine, machine_times())
    late = None
    if looks and looked:
        late = looks.late_share(looked, looks())
    n = len(out["samples"])
    wait = out.get("client_wait_s")
    return {
        "n": n,
        "errors": out["errors"],
        "req_per_s": n / out["wall_s"],
        "cpu_us_per_req": used / max(n, 1) * 1e6,
        "client_cpu_us_per_req": out["client_cpu_s"] / max(n, 1) * 1e6,
        "client_busy": out["client_cpu_s"] / out["wall_s"],
        "client_waiting": None if wait is None else wait / out["wall_s"],
        "idle": idle,
        "loop_late": late,
        **percentiles(out["samples"]),
    }


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = work / "origin"
    keys = write_objects(root, max(args.sets))
    out: dict[str, Any] = {"small": [], "big": []}
    context = multiprocessing.get_context("spawn")
    with FileOrigin(root) as origin, Nginx(work / "nginx", origin.port) as nginx:
        credentials = write_credentials(work / "credentials.toml")
        config = work / "lota.toml"
        config.write_text(
            f'[cache]\ndirs = ["{work / "lota-cache"}"]\nsize = "20GiB"\n'
            'revalidate_after = "1h"\n'
            f'[auth]\ncredentials = "{credentials}"\n'
            f'[regions.us-east]\nendpoint = "{origin.endpoint}"\n'
            + (f'[catalog]\nurl = "sqlite:///{work / "catalog.db"}"\n' if args.catalog else "")
        )
        env = {"LOTA_WORKERS": str(args.workers), "LOTA_LOG_LEVEL": "WARNING"}
        node = LotaProcess(["--config", str(config)], log_path=work / "lota.log", env=env)
        node.start()
        try:
            out["lota_scheduling"] = policy_of(lota_pids(node)[-1])  # a worker's, as it runs
            lota_urls = presigned_urls(node.url, BUCKET, keys)
            looks = LoopLooks(node)
            systems = {
                "LOTA": (lota_urls, lota_pids(node), looks),
                "nginx": ([u.replace(node.url, nginx.url) for u in lota_urls], nginx.pids(), None),
            }
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                for urls, pids, _ in systems.values():  # the cold fill, untimed
                    await cell(pool, urls, len(urls), 64, pids)
                looks.calibrate()
                for size in args.sets:
                    for urls, pids, _ in systems.values():  # the hot set read, untimed
                        await cell(pool, urls[:size], size, 64, pids)
                    for concurrency in (16, 64):
                        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
                        for n in range(args.runs):  # alternated: both see the same phases
                            for name, (urls, pids, looking) in systems.items():
                                c = await cell(
                                    pool, urls[:size], args.requests, concurrency, pids, looking
                                )
                                rounds[name].append(c)
                                print(
                                    f"{name:>5} 64 KiB x{size} c={concurrency} round {n + 1}: "
                                    f"{c['req_per_s']:,.0f} req/s p50 {c['p50']:.2f} ms "
                                    f"p99 {c['p99']:.2f} ms {c['cpu_us_per_req']:.0f} µs CPU/req "
                                    f"{c['errors'] or ''}",
                                    flush=True,
                                )
                        for name, cells in rounds.items():
                            row = medians(cells)
                            row.update(system=name, hot_set=size, concurrency=concurrency)
                            out["small"].append(row)
            big = {"LOTA": presigned_urls(node.url, BUCKET, ["big.bin"])[0]}
            big["nginx"] = big["LOTA"].replace(node.url, nginx.url)
            for url in big.values():
                await streams([url], GiB)  # fill, untimed
            for clients in (1, 4):
                for name, url in big.items():
                    runs = [await streams([url] * clients, GiB) for _ in range(args.runs)]
                    best = max(r["GBps"] for r in runs)
                    median = sorted(r["GBps"] for r in runs)[len(runs) // 2]
                    errors = [e for r in runs for e in r["errors"]]
                    out["big"].append(
                        {"system": name, "clients": clients, "median_GBps": median,
                         "best_GBps": best, "errors": errors}
                    )  # fmt: skip
                    print(f"{name:>5} 1 GiB x{clients}: median {median:.2f} GB/s {errors or ''}")
        finally:
            node.stop()
    return out


# The figures of a cell's rounds that its row gives the median of.
_MEDIANS = (
    "req_per_s",
    "p50",
    "p99",
    "cpu_us_per_req",
    "client_cpu_us_per_req",
    "client_busy",
    "client_waiting",
    "idle",
    "loop_late",
)


def medians(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds of a cell: the median of each figure (the upper one of an even
    count), every round's req/s, and every error."""
    row: dict[str, Any] = {}
    for key in _MEDIANS:  # of the rounds that measured it (None where none did)
        told = sorted(c[key] for c in cells if c[key] is not None)
        row[key] = told[len(told) // 2] if told else None
    row["rounds_req_per_s"] = [c["req_per_s"] for c in cells]
    row["n"] = sum(c["n"] for c in cells)
    row["errors"] = dict(sum((Counter(c["errors"]) for c in cells), Counter()))
    return row


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    rows = []
    by = {(r["system"], r["hot_set"], r["concurrency"]): r for r in out["small"]}
    for size in args.sets:
        for concurrency in (16, 64):
            lota, nginx = by[("LOTA", size, concurrency)], by[("nginx", size, concurrency)]
            rows.append(
                [
                    f"{size:,}",
                    concurrency,
                    f"{lota['req_per_s']:,.0f}",
                    f"{nginx['req_per_s']:,.0f}",
                    f"{lota['req_per_s'] / nginx['req_per_s']:.2f}x",
                    " ".join(
                        f"{a / b:.2f}"
                        for a, b in zip(
                            lota["rounds_req_per_s"], nginx["rounds_req_per_s"], strict=True
                        )
                    ),
                    f"{lota['p50']:.2f} / {lota['p99']:.2f}",
                    f"{nginx['p50']:.2f} / {nginx['p99']:.2f}",
                    f"{lota['p99'] / nginx['p99']:.2f}x",
                    f"{lota['cpu_us_per_req']:.0f} / {nginx['cpu_us_per_req']:.0f}",
                    f"{lota['client_cpu_us_per_req']:.0f} / {nginx['client_cpu_us_per_req']:.0f}",
                    f"{lota['client_busy']:.0%} / {nginx['client_busy']:.0%}",
                    f"{_share(lota['client_waiting'])} / {_share(nginx['client_waiting'])}",
                    f"{lota['idle']:.0%} / {nginx['idle']:.0%}",
                    f"{lota['loop_late']:.1%}",
                ]
            )
    catalog = " and a SQLite catalog" if args.catalog else ""
    print(
        f"\n64 KiB hits, presigned SigV4 URLs; LOTA with {args.workers} workers{catalog}"
        f" under {out['lota_scheduling']}, nginx with 2; medians of {args.runs} rounds, LOTA"
        " and nginx alternated in each"
    )
    print(
        table(
            [
                "hot set",
                "conc",
                "LOTA req/s",
                "nginx req/s",
                "req/s LOTA / nginx",
                "each round",
                "LOTA p50 / p99 ms",
                "nginx p50 / p99 ms",
                "p99 LOTA / nginx",
                "CPU µs/req LOTA / nginx",
                "load generator µs/req",
                "load generator busy",
                "load generator waiting for a core",
                "cores idle",
                "LOTA loop >5 ms late",
            ],
            rows,
        )
    )
    big = {(r["system"], r["clients"]): r for r in out["big"]}
    print("\n1 GiB hits (curl)")
    print(
        table(
            ["clients", "LOTA median GB/s", "nginx median GB/s", "LOTA / nginx"],
            [
                [
                    c,
                    big[("LOTA", c)]["median_GBps"],
                    big[("nginx", c)]["median_GBps"],
                    f"{big[('LOTA', c)]['median_GBps'] / big[('nginx', c)]['median_GBps']:.2f}x",
                ]
                for c in (1, 4)
            ],
        )
    )


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nginx", description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000, help="per 64 KiB cell")
    parser.add_argument("--sets", default="1000,20000", help="hot set sizes")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--runs", type=int, default=3, help="rounds of each measurement (medians are reported)"
    )
    parser.add_argument(
        "--catalog", action="store_true", help="LOTA with a catalog (SQLite): reads check it"
    )
    args = parser.parse_args()
    args.sets = [int(s) for s in args.sets.split(",")]
    if not Path(NGINX).exists():
        raise SystemExit("bench.nginx needs nginx: apt-get install nginx")
    with tempfile.TemporaryDirectory(prefix="lota-bench-nginx-") as tmp:
        out = await run(args, Path(tmp))
    report(out, args)
    print(f"\nsaved {save('nginx', {'args': vars(args), **out})}")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
