"""The simulator's plots (matplotlib, Agg: no display needed), drawn from report.json's
figures only, so a report can be drawn again from its JSON:

- ``hit_rate.png``: the hit rate by epoch, and over the whole run (node restart marked);
- ``origin_vs_unique.png``: bytes the origin sent against the unique bytes read, per step;
- ``latency_cdf.png``: read latency by source (HIT, PEER, MISS, PENDING, origin direct);
- ``gpu_throughput.png``: what each GPU received per second, per step;
- ``xregion_save.png``: checkpoint save acknowledgement through LOTA against a direct write,
  and the read-backs from both regions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

MiB = 1024 * 1024
COLOURS = {
    "HIT": "tab:green",
    "PEER": "tab:blue",
    "MISS": "tab:red",
    "PENDING": "tab:purple",
    "ORIGIN": "black",
    "LOTA": "tab:green",
}
Row = list[Any]  # one sample: report.json's samples_columns


def draw(out: Path, figures: dict[str, Any]) -> list[Path]:
    """Every plot the figures allow; the paths written."""
    makers: dict[str, Callable[[dict[str, Any], Any], bool]] = {
        "hit_rate.png": hit_rate,
        "origin_vs_unique.png": origin_vs_unique,
        "latency_cdf.png": latency_cdf,
        "gpu_throughput.png": gpu_throughput,
        "xregion_save.png": xregion_save,
    }
    written = []
    for name, maker in makers.items():
        fig = plt.figure(figsize=(11, 4.5))
        if maker(figures, fig):
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            written.append(out / name)
        plt.close(fig)
    return written


def _reads(figures: dict[str, Any]) -> list[Row]:
    return [row for row in figures["samples"] if not row[3] and row[9]]


def hit_rate(figures: dict[str, Any], fig: Any) -> bool:
    epochs = figures["summary"]["epochs"]
    axes = fig.subplots(1, 2, width_ratios=[1, 2.5]) if epochs else [None, fig.subplots()]
    if epochs:
        ax: Axes = axes[0]
        xs = range(len(epochs))
        bars = {
            "byte hit rate (origin)": [e["byte_hit_rate"] or 0 for e in epochs],
            "HIT": [e.get("HIT", 0) for e in epochs],
            "HIT + PEER": [e.get("HIT", 0) + e.get("PEER", 0) for e in epochs],
        }
        for i, (label, values) in enumerate(bars.items()):
            ax.bar([x + (i - 1) * 0.27 for x in xs], values, 0.27, label=label)
        ax.set_xticks(list(xs), [e["epoch"] for e in epochs])
        ax.set_ylim(0, 1.05)
        ax.set_title("by epoch")
        ax.legend(fontsize=7, loc="lower right")
    _over_time(figures, axes[1])
    return True


def _over_time(figures: dict[str, Any], ax: Axes) -> None:
    """Shares of the reads through LOTA finishing in each time bin."""
    rows = [r for r in _reads(figures) if r[4] != "ORIGIN"]
    end = max((r[6] + r[7] for r in rows), default=1.0)
    width = max(1.0, end / 80)
    bins: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        bins[int((r[6] + r[7]) / width)].append(r[4])
    xs = sorted(bins)
    ax.plot(
        [x * width for x in xs],
        [bins[x].count("HIT") / len(bins[x]) for x in xs],
        label="HIT",
        color=COLOURS["HIT"],
    )
    ax.plot(
        [x * width for x in xs],
        [(bins[x].count("HIT") + bins[x].count("PEER")) / len(bins[x]) for x in xs],
        label="HIT + PEER",
        color=COLOURS["PEER"],
    )
    t0 = min(s["started"] for s in figures["steps"])
    for i, s in enumerate(figures["steps"]):
        if not s["direct"]:
            ax.axvspan(
                s["started"] - t0, s["started"] - t0 + s["wall_s"], alpha=0.08 + 0.06 * (i % 2)
            )
            ax.text(s["started"] - t0, 1.02, s["name"], fontsize=6, rotation=30)
    restart = figures["summary"].get("restart")
    if restart:
        ax.axvline(restart["killed_at_s"], color="red", linestyle="--", label="node killed")
        ax.axvline(
            restart["killed_at_s"] + restart["down_s"],
            color="grey",
            linestyle="--",
            label="node ready",
        )
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("share of reads")
    ax.set_title("over time (reads through LOTA, by x-lota-cache)", pad=18)
    ax.legend(fontsize=7, loc="lower right")


def origin_vs_unique(figures: dict[str, Any], fig: Any) -> bool:
    steps = [s for s in figures["steps"] if not s["direct"] and s["reads"]]
    ax: Axes = fig.subplots()
    xs = range(len(steps))
    series = {
        "GPU bytes through LOTA": [s["gpu_bytes"] / MiB for s in steps],
        "unique bytes read": [s["unique_bytes"] / MiB for s in steps],
        "new bytes (never read before)": [s["new_bytes"] / MiB for s in steps],
        "origin bytes (lota_origin_bytes_in_total)": [
            sum(s["origin_bytes"].values()) / MiB for s in steps
        ],
    }
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + (i - 1.5) * 0.2 for x in xs], values, 0.2, label=label)
    ax.set_xticks(list(xs), [s["name"] for s in steps], rotation=20, fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("origin bytes against unique bytes, per step")
    ax.legend(fontsize=8)
    return bool(steps)


def latency_cdf(figures: dict[str, Any], fig: Any) -> bool:
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in _reads(figures):
        phases[figures["steps"][row[0]]["phase"]][row[4]].append(row[7] * 1000)
    axes = fig.subplots(1, len(phases), squeeze=False)[0]
    for ax, (phase, by_source) in zip(axes, phases.items(), strict=True):
        for source, values in sorted(by_source.items()):
            values.sort()
            ys = [(i + 1) / len(values) for i in range(len(values))]
            label = "origin direct" if source == "ORIGIN" else source
            ax.plot(values, ys, label=f"{label} ({len(values)})", color=COLOURS.get(source))
        ax.set_xscale("log")
        ax.set_xlabel("ms to the last byte")
        ax.set_title(phase)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of reads")
    return bool(phases)


def gpu_throughput(figures: dict[str, Any], fig: Any) -> bool:
    steps = [s for s in figures["steps"] if s["per_gpu_MBps"] and not s["direct"] and s["reads"]]
    gpus = [g for g in figures["settings"]["gpus"] if g["node"] >= 0]
    ax: Axes = fig.subplots()
    width = 0.8 / max(1, len(steps))
    for i, s in enumerate(steps):
        values = [s["per_gpu_MBps"].get(str(g), 0.0) for g in range(len(gpus))]
        ax.bar([g + i * width for g in range(len(gpus))], values, width, label=s["name"])
    ax.set_xticks(
        [g + 0.4 for g in range(len(gpus))], [g["name"] for g in gpus], rotation=90, fontsize=6
    )
    ax.set_ylabel("MB/s received")
    ax.set_title("per-GPU throughput (its bytes / time to its last byte)")
    ax.legend(fontsize=7, ncol=2)
    return bool(steps)


def xregion_save(figures: dict[str, Any], fig: Any) -> bool:
    names = {s["name"]: i for i, s in enumerate(figures["steps"])}
    if "save" not in names:
        return False
    left, right = fig.subplots(1, 2)
    acks: dict[str, list[float]] = defaultdict(list)
    back: dict[str, list[float]] = defaultdict(list)
    gpus = figures["settings"]["gpus"]
    for row in figures["samples"]:
        name = figures["steps"][row[0]]["name"]
        if row[3] and name.startswith("save"):
            acks["through LOTA" if row[4] == "LOTA" else "straight to the far region"].append(
                row[7] * 1000
            )
        elif name.startswith("read back"):
            region = gpus[row[1]]["region"]
            back[f"{name[10:-1]}, {region} GPUs, {row[4]}"].append(row[7] * 1000)
    _cdfs(left, acks, "save acknowledged (ms)")
    _cdfs(right, back, "read-back (ms to the last byte)")
    return True


def _cdfs(ax: Axes, series: dict[str, list[float]], title: str) -> None:
    for label, values in sorted(series.items()):
        values.sort()
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_ylabel("share")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
