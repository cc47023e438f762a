"""The trace model's report (:mod:`bench.sim.model`): ``report.json`` (every figure, the
settings, the mix, LOTA's version), ``report.md`` (the tables a person reads first) and
``model-hit-rate-vs-cache.png``, all drawn from the figures dict alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PB = 10**15
TARGET = 0.997
"""The production system's reference hit rate (15,000 GPUs, 20 PB of cache)."""
PLOT = "model-hit-rate-vs-cache.png"


def write(out: Path, figures: dict[str, Any]) -> list[Path]:
    paths = [out / "report.json", out / "report.md", out / PLOT]
    paths[0].write_text(json.dumps(figures, indent=1) + "\n")
    paths[1].write_text(markdown(figures))
    plot(figures, paths[2])
    return paths


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _pb(x: float) -> str:
    return f"{x / PB:.2f} PB" if x >= PB / 10 else f"{x / 10**12:.0f} TB"


def markdown(f: dict[str, Any]) -> str:
    s, h = f["settings"], f["headline"]
    lines = [
        "# LOTA trace model",
        "",
        f"{s['gpus']:,} GPUs ({s['nodes']:,} nodes of {s['gpus_per_node']}), "
        f"{_pb(s['cache_bytes'])} of cache ({s['cache_per_node_bytes'] / 10**12:.2f} TB a node), "
        f"{s['days']:g} days after a {s['warmup_days']:g}-day warm-up; SHARDS sampling rate "
        f"{s['sampling_rate']:.6f} ({s['sampled_reads']:,} sampled reads of "
        f"{s['sampled_chunks']:,} chunks); {s['membership_changes']} membership changes. "
        f"LOTA {f['lota_version']}; `{f.get('command', '')}`; {f['runtime_seconds']:.0f} s.",
        "",
        f"**Byte hit rate {_pct(h['byte_hit_rate'])}** (object, per chunk read: "
        f"{_pct(h['object_hit_rate'])}).",
        "",
        "## Where reads were served",
        "",
        "| | local cache | owner's cache | origin |",
        "|---|---|---|---|",
        "| bytes | "
        + " | ".join(_pct(h["bytes"][k], 3) for k in ("local", "owner", "origin"))
        + " |",
        "| reads | "
        + " | ".join(_pct(h["reads"][k], 3) for k in ("local", "owner", "origin"))
        + " |",
        "",
        f"Origin egress {_pb(h['origin_bytes'])} for {_pb(h['distinct_bytes'])} of distinct "
        f"bytes read (warm-up included): {h['origin_over_distinct']:.3f}x. "
        f"The {s['days']:g} days read {_pb(h['week_bytes_read'])}, "
        f"{_pb(h['week_origin_bytes'])} of it from the origin. "
        f"Busiest node / mean (bytes its cache served or filled): "
        f"{h['node_load_max_over_mean']:.2f} in the sampled trace, where each kept chunk "
        f"stands for 1/rate chunks yet all its reads land on one node, so a chunk every "
        f"rank reads weighs on its owner far more than at full scale; LOTA's ownership "
        f"gives the busiest member {s['ownership_slots_max_over_mean']:.3f}x the mean share "
        f"of chunks.",
        "",
        "| reads of | bytes in the week | byte hit rate |",
        "|---|---|---|",
    ]
    for kind, k in h["by_kind"].items():
        if k["bytes"]:
            lines.append(f"| {kind} | {_pb(k['bytes'])} | {_pct(k['byte_hit_rate'])} |")
    lines += [
        "",
        "## Hit rate against cache size, and the libCacheSim cross-check",
        "",
        "The reads that reached a chunk's owner, replayed per node through S3-FIFO alone: "
        "LOTA's (`lota.cache.eviction.S3FIFO`) and libCacheSim's (`S3FIFOv0`, the paper's "
        "algorithm, as LOTA's), at the same cache size (LOTA's mean fill between its "
        "watermarks). LOTA itself runs S3-FIFO behind its admission rule.",
        "",
        "| cache | per node | byte hit rate | object hit rate | origin / distinct "
        "| owner miss ratio: LOTA (admission + S3-FIFO) | LOTA S3-FIFO | libCacheSim S3-FIFO "
        "| gap |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in f["curve"]:
        c = p["s3fifo"]
        lines.append(
            f"| {_pb(p['cache_bytes'])} | {p['cache_per_node_bytes'] / 10**12:.2f} TB "
            f"| {_pct(p['byte_hit_rate'])} | {_pct(p['object_hit_rate'])} "
            f"| {p['origin_over_distinct']:.3f}x | {_pct(p['owner_miss_ratio'])} "
            f"| {_pct(c['lota_miss_ratio'])} | {_pct(c['libcachesim_miss_ratio'])} "
            f"| {c['gap_points']:.2f} pts |"
        )
    lines += [
        "",
        f"## What if (at {_pb(s['cache_bytes'])})",
        "",
        "Best possible: an upper bound on LOTA's hits, every node's cache unbounded under "
        "the same ownership and the same failures (a node keeps every chunk it read or "
        "owned until it fails; a read misses only if neither the reading node nor the "
        "chunk's owner holds the chunk).",
        "",
        "| scenario | byte hit rate | object hit rate | best possible |",
        "|---|---|---|---|",
    ]
    for w in f["what_if"]:
        lines.append(
            f"| {w['scenario']} | {_pct(w['byte_hit_rate'])} | {_pct(w['object_hit_rate'])} "
            f"| {_pct(w['best_byte_hit_rate'])} |"
        )
    lines += ["", reach(f), ""]
    return "\n".join(lines)


def reach(f: dict[str, Any]) -> str:
    """Which scenarios reach the production system's 99.7%, from the figures."""
    reached = [w["scenario"] for w in f["what_if"] if w["byte_hit_rate"] >= TARGET]
    possible = [w["scenario"] for w in f["what_if"] if w["best_byte_hit_rate"] >= TARGET]
    return (
        f"{_pct(TARGET, 1)} is reached by LOTA in: {', '.join(reached) or 'none of these'}; "
        f"possible at all (unbounded caches) in: {', '.join(possible) or 'none of these'}."
    )


def plot(f: dict[str, Any], path: Path) -> None:
    curve = f["curve"]
    x = [p["cache_bytes"] / PB for p in curve]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.plot(
        x, [p["byte_hit_rate"] for p in curve], "o-", color="tab:green", label="LOTA, byte hit rate"
    )
    ax.plot(x, [1 - p["owner_byte_miss_ratio"] for p in curve], "s--", color="tab:green",
            alpha=0.6, label="LOTA at the owners (admission + S3-FIFO)")  # fmt: skip
    ax.plot(x, [1 - p["s3fifo"]["lota_byte_miss_ratio"] for p in curve], "^:", color="tab:blue",
            label="LOTA's S3-FIFO alone, same owner reads")  # fmt: skip
    ax.plot(x, [1 - p["s3fifo"]["libcachesim_byte_miss_ratio"] for p in curve], "x:",
            color="tab:red", label="libCacheSim S3-FIFO, same owner reads")  # fmt: skip
    best = f["what_if"][0]["best_byte_hit_rate"]
    ax.axhline(best, color="grey", ls="--", lw=1, label=f"best possible ({_pct(best)})")
    ax.axhline(TARGET, color="black", ls=":", lw=1, label="99.7%")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_xlabel("cluster cache (PB)")
    ax.set_ylabel("hit rate")
    s = f["settings"]
    ax.set_title(f"{s['gpus']:,} GPUs, {s['days']:g} days of the documented mix", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
