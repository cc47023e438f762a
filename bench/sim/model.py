"""``python -m bench.sim model``: what LOTA's cache does for a 15,000-GPU cluster, from a
trace model that runs LOTA's own placement and eviction code.

    python -m bench.sim model --gpus 15000 --cache 20PB --out /tmp/model   # ~10-15 min here
    python -m bench.sim model --out /tmp/model --quick                     # 1,200 GPUs, 2 days

A week of the documented mix (:mod:`bench.sim.model_workload`: datasets and their epochs,
evaluation, checkpoint restores, shared model weights, new-data ingest, node churn),
spatially sampled as in SHARDS so that a cluster of ``gpus / 8`` nodes, each with
``cache / nodes`` bytes scaled by the sampling rate, replays in minutes on two cores
(:mod:`bench.sim.model_replay`). It reports:

- the byte and object (per chunk read) hit rate at ``--cache``, split by where reads were
  served (the node's own cache, the chunk's owner, the origin), origin egress against the
  distinct bytes read, and each node's load (max over mean);
- the curve of hit rate against cache size (a quarter, half, once and twice ``--cache``),
  with the owner reads replayed per node through S3-FIFO alone, LOTA's and libCacheSim's
  (the cross-check: the two agree within a point at every size), in a PNG;
- what-if rows: no churn, no ingest, neither, each with an upper bound on LOTA's hits
  (unbounded caches under the same ownership and failures), to say what reaching 99.7%
  takes.

Figures are scaled back up by the sampling rate (bytes / rate); every one comes from
running the code. ``DIR`` gets ``report.json``, ``report.md`` and
``model-hit-rate-vs-cache.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import lota
from bench.sim import model_report
from bench.sim.model_replay import (
    SOURCES,
    Replay,
    owners,
    replay,
    replay_s3fifo,
    slot_balance,
    unbounded,
)
from bench.sim.model_workload import (
    CHUNK,
    CHURN,
    DATASETS,
    GPUS_PER_NODE,
    JOBS,
    KINDS,
    MODELS,
    PB,
    REFERENCE_GPUS,
    SERVING,
    SWEEP,
    SWEEP_SLOTS,
    WARMUP,
    Builder,
    Trace,
)
from lota.cluster.config import ClusterConfig
from lota.config import CacheConfig

CURVE = (0.25, 0.5, 1.0, 2.0)
"""The curve's cache sizes, as multiples of ``--cache``."""
RATE = 1 / 2048
"""The default sampling rate: ~620 sampled chunks of cache per node at 20 PB and 15,000
GPUs (155 at 5 PB), ~4 M sampled reads for the week."""
QUICK_GPUS, QUICK_DAYS = 1200, 2.0
SCENARIOS = (
    ("as documented", True, True),
    ("no churn", False, True),
    ("no ingest", True, False),
    ("neither", False, False),
)
_UNITS = {"TB": 10**12, "PB": 10**15, "TIB": 1024**4, "PIB": 1024**5, "GB": 10**9}


def parse_bytes(text: str) -> int:
    """``20PB`` -> 2e16 (decimal units as storage is sold; TiB and PiB too)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20PB, 500TB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


class Progress:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.0f} s] {message}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim model", description=__doc__)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs (default 15000)")
    parser.add_argument("--cache", type=parse_bytes, default=None, help="default 20PB")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="1,200 GPUs, 2 days: a smoke test")
    parser.add_argument("--days", type=float, default=None, help="default 7 (quick: 2)")
    parser.add_argument("--rate", type=float, default=RATE, help="SHARDS sampling rate")
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args(argv)
    try:
        import libcachesim  # noqa: F401
    except ImportError:
        print("the cross-check needs libcachesim: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    gpus = args.gpus or (QUICK_GPUS if args.quick else REFERENCE_GPUS)
    cache = args.cache or int(20 * PB * gpus / REFERENCE_GPUS)
    days = args.days or (QUICK_DAYS if args.quick else 7.0)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = run(gpus, cache, days, args.rate, args.seed, Progress())
    figures["command"] = "python -m bench.sim model " + " ".join(argv)
    for path in model_report.write(args.out, figures):
        print(f"wrote {path}")
    head = figures["headline"]
    print(
        f"{gpus:,} GPUs, {cache / PB:g} PB of cache: byte hit rate {head['byte_hit_rate']:.2%} "
        f"(object {head['object_hit_rate']:.2%}); local {head['bytes']['local']:.2%}, "
        f"owner {head['bytes']['owner']:.2%}, origin {head['bytes']['origin']:.2%}"
    )
    return 0


def run(
    gpus: int, cache: int, days: float, rate: float, seed: int, say: Progress
) -> dict[str, Any]:
    say(f"building the trace: {gpus:,} GPUs, {days:g} days, sampling rate {rate:.6f}")
    trace = Builder(gpus, days, rate, seed).build()
    say(f"{len(trace.chunk):,} sampled reads of {len(trace.keys):,} chunks, {trace.nodes:,} nodes")
    owned = owners(trace, say)
    curve = []
    main_result: Replay | None = None
    for share in CURVE:
        size = int(cache * share)
        budget = int(size / trace.nodes * rate)
        result = replay(trace, owned, budget, record=True)
        check = replay_s3fifo(trace, result.stream, budget)
        curve.append(_point(trace, size, budget, result) | {"s3fifo": _check(result, check)})
        say(f"{size / PB:g} PB: byte hit rate {curve[-1]['byte_hit_rate']:.4f}")
        if share == 1.0:
            main_result = result
        result.stream = None
    assert main_result is not None
    budget = int(cache / trace.nodes * rate)
    what_if = []
    for name, churn, ingest in SCENARIOS:
        if churn and ingest:
            figures = _point(trace, cache, budget, main_result)
        else:
            figures = _point(
                trace, cache, budget, replay(trace, owned, budget, churn=churn, ingest=ingest)
            )
        best = unbounded(trace, owned, churn=churn, ingest=ingest)
        what_if.append(
            {"scenario": name, "churn": churn, "ingest": ingest, "best_byte_hit_rate": best}
            | {k: figures[k] for k in ("byte_hit_rate", "object_hit_rate")}
        )
        say(f"{name}: byte hit rate {figures['byte_hit_rate']:.4f}, best possible {best:.4f}")
    headline = next(p for p in curve if p["cache_bytes"] == int(cache))
    return {
        "lota_version": lota.__version__,
        "settings": _settings(trace, gpus, cache, days, rate, seed),
        "mix": _mix(),
        "trace": _trace(trace),
        "headline": headline,
        "curve": curve,
        "what_if": what_if,
        "runtime_seconds": round(time.monotonic() - say.start, 1),
    }


def _point(trace: Trace, cache: int, budget: int, r: Replay) -> dict[str, Any]:
    reads, bytes_ = sum(r.reads), sum(r.bytes)
    distinct = int(trace.sizes[np.unique(trace.chunk)].sum())
    assert r.served is not None
    return {
        "cache_bytes": cache,
        "cache_per_node_bytes": cache // trace.nodes,
        "sampled_budget_chunks_per_node": round(budget / CHUNK, 1),
        "byte_hit_rate": 1 - r.bytes[2] / bytes_,
        "object_hit_rate": 1 - r.reads[2] / reads,
        "bytes": {s: r.bytes[i] / bytes_ for i, s in enumerate(SOURCES)},
        "reads": {s: r.reads[i] / reads for i, s in enumerate(SOURCES)},
        "by_kind": {
            k: {"bytes": v[1] / trace.rate, "byte_hit_rate": v[3] / v[1] if v[1] else None}
            for k, v in r.by_kind.items()
        },
        "week_bytes_read": bytes_ / trace.rate,
        "week_origin_bytes": r.bytes[2] / trace.rate,
        "origin_bytes": r.origin_bytes_all / trace.rate,
        "distinct_bytes": distinct / trace.rate,
        "origin_over_distinct": r.origin_bytes_all / distinct,
        "node_load_max_over_mean": float(r.served.max() / r.served.mean()),
        "owner_byte_miss_ratio": 1 - r.owner_hit_bytes / r.owner_bytes,
        "owner_miss_ratio": 1 - r.owner_hits / r.owner_reads,
    }


def _check(r: Replay, s3fifo: dict[str, float]) -> dict[str, float]:
    gap = abs(s3fifo["lota_miss_ratio"] - s3fifo["libcachesim_miss_ratio"])
    return s3fifo | {"gap_points": 100 * gap, "within_1_point": gap <= 0.01}


def _settings(
    trace: Trace, gpus: int, cache: int, days: float, rate: float, seed: int
) -> dict[str, Any]:
    store, cluster = CacheConfig(), ClusterConfig()
    return {
        "gpus": gpus,
        "gpus_per_node": GPUS_PER_NODE,
        "nodes": trace.nodes,
        "cache_bytes": cache,
        "cache_per_node_bytes": cache // trace.nodes,
        "days": days,
        "warmup_days": WARMUP / 86400,
        "sampling_rate": rate,
        "sampled_reads": len(trace.chunk),
        "sampled_chunks": len(trace.keys),
        "membership_changes": len(trace.downs) - 1,
        "ownership_slots_max_over_mean": slot_balance(trace.nodes),
        "seed": seed,
        "chunk_size": CHUNK,
        "watermarks": [store.high_watermark, store.low_watermark],
        "hot_reads": cluster.hot_reads,
        "hot_window_s": cluster.hot_window,
        "hot_share": cluster.hot_share,
        "curve_multiples": list(CURVE),
    }


def _mix() -> dict[str, Any]:
    def rows(items: Any) -> list[dict[str, Any]]:
        return [dataclasses.asdict(i) for i in items]

    return {
        "reference_gpus": REFERENCE_GPUS,
        "datasets": rows(DATASETS),
        "models": rows(MODELS),
        "jobs": [{k: v for k, v in j.items() if k != "node_range"} for j in rows(JOBS)],
        "sweeps": {"slots": SWEEP_SLOTS}
        | {
            k: v
            for k, v in rows([SWEEP])[0].items()
            if k not in ("name", "node_range", "start_hour")
        },
        "serving": {k: v for k, v in dataclasses.asdict(SERVING).items() if k != "node_range"},
        "churn": dataclasses.asdict(CHURN),
    }


def _trace(trace: Trace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, name in enumerate(KINDS):
        rows = trace.chunk[trace.kind == k]
        out[name] = {
            "sampled_reads": len(rows),
            "bytes": float(trace.sizes[rows].sum()) / trace.rate,
        }
    out["ingested_bytes"] = float(trace.sizes[trace.ingested].sum()) / trace.rate
    return out


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
