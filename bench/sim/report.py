"""The simulator's report: figures from what the GPUs saw, checked against the nodes' own
``/_lota/metrics``, written as ``report.json`` (every figure, the settings, LOTA's version,
every sample) and ``report.md`` (the tables a person reads first).

Where each figure comes from:

- reads, bytes, latency, ``x-lota-cache`` by source, digests: the GPUs (every sample);
- origin bytes: the nodes' ``lota_origin_bytes_in_total`` (body bytes from origins), per
  region; checked against the bytes that crossed the emulated links to the origins;
- unique bytes: the distinct bytes the step's reads asked for; new bytes: those no earlier
  step read (what the origin must send at least once);
- byte hit rate: the share of the bytes the GPUs got that the origin did not send during
  the step, 1 - origin / GPU bytes (0 when the origin sent more: whole chunks for a range);
- HIT / PEER / MISS shares: of the reads through LOTA, by their ``x-lota-cache`` (PEER: from
  the chunk's owner node, which may itself have filled it from the origin).

Cross-check, per step: the reads the GPUs counted by source against the nodes'
``lota_cache_requests_total{source}``; the bytes they received from the read path against
``lota_cache_bytes_total``; origin body bytes against the links' bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.sim.run_gpus import Fleet, Sample
from bench.sim.run_topology import Shape
from bench.sim.workloads import Sizes

if TYPE_CHECKING:
    from bench.sim.run import Restart, StepResult

MiB = 1024 * 1024
SOURCES = ("HIT", "PEER", "MISS", "PENDING", "STALE", "BYPASS", "ORIGIN")
READ_PATH = ("HIT", "PEER", "MISS", "STALE", "BYPASS")  # counted in lota_cache_bytes_total
READ_PHASES = ("epochs", "restore", "agents")
HEADER_ALLOWANCE = 2048  # bytes of HTTP response head per origin request, at most


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99, p99.9 in ms, and how many samples they rest on."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50": statistics.median(ordered) * 1000,
        "p99": at(0.99),
        "p99.9": at(0.999),
    }


def metric(counters: dict[str, float], name: str, **labels: str) -> float:
    """The sum of a metric's series whose labels include `labels`."""
    total = 0.0
    for key, value in counters.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def node_sum(counters: Iterable[dict[str, float]], name: str, **labels: str) -> float:
    return sum(metric(c, name, **labels) for c in counters)


def step_figures(
    r: StepResult, shape: Shape, seen: set[tuple[str, int, int]], restarted: bool
) -> dict[str, Any]:
    """Every figure of one step; `seen`: the byte ranges earlier steps read (updated)."""
    reads = [s for s in r.samples if not s.write]
    through = [s for s in reads if s.source != "ORIGIN"]
    gpu_bytes = sum(s.size for s in through)
    near, far = r.counters[: shape.nodes], r.counters[shape.nodes :]
    origin = {
        "near nodes": node_sum(near, "lota_origin_bytes_in_total"),
        "far node": node_sum(far, "lota_origin_bytes_in_total"),
    }
    ranges = {(s.key, s.first, s.size) for s in through if s.ok}
    unique, new = sum(x[2] for x in ranges), sum(x[2] for x in ranges - seen)
    seen |= ranges
    by_source = Counter(s.source or "FAILED" for s in reads)
    latency: dict[str, list[float]] = defaultdict(list)
    for s in r.samples:
        if s.ok:
            latency[("write " if s.write else "") + s.source].append(s.seconds)
    total_origin = sum(origin.values())
    return {
        "name": r.step.name,
        "phase": r.step.phase,
        "direct": r.step.direct,
        "started": r.started,
        "wall_s": r.wall,
        "reads": len(reads),
        "writes": len(r.samples) - len(reads),
        "right": sum(1 for s in r.samples if s.ok),
        "wrong": sum(1 for s in r.samples if not s.ok and not s.error),
        "failed": sum(1 for s in r.samples if s.error),
        "retried": sum(1 for s in r.samples if s.attempts > 1),
        "gpu_bytes": gpu_bytes,
        "direct_bytes": sum(s.size for s in reads if s.source == "ORIGIN"),
        "written_bytes": sum(s.size for s in r.samples if s.write),
        "unique_bytes": unique,
        "new_bytes": new,
        "origin_bytes": origin,
        "origin_over_unique": total_origin / unique if unique else None,
        "byte_hit_rate": 1 - min(total_origin, gpu_bytes) / gpu_bytes if gpu_bytes else None,
        "sources": dict(by_source),
        "shares": {k: by_source[k] / len(through) for k in SOURCES[:-1]} if through else {},
        "latency_ms": {k: percentiles(v) for k, v in sorted(latency.items())},
        "gbps": sum(s.size for s in r.samples) / r.wall / 1e9,
        "per_gpu_MBps": per_gpu(r),
        "links": r.links,
        "origin_bytes_by_node": [metric(c, "lota_origin_bytes_in_total") for c in r.counters],
        "peer_served_bytes_by_node": [metric(c, "lota_peer_served_bytes_total") for c in near],
        "peer_fallbacks": node_sum(near, "lota_peer_fallbacks_total"),
        "crosscheck": crosscheck(r, through, restarted),
        "restart_here": restarted,
        **r.extra,
    }


def per_gpu(r: StepResult) -> dict[str, float]:
    """MB/s each GPU moved: its bytes over the time from the step's start to its last
    byte (none for the agents, whose loops idle by design)."""
    if r.step.duration:
        return {}
    ends: dict[int, float] = defaultdict(float)
    got: Counter[int] = Counter()
    for s in r.samples:
        ends[s.gpu] = max(ends[s.gpu], s.start + s.seconds - r.started)
        got[s.gpu] += s.size
    return {str(g): got[g] / ends[g] / 1e6 for g in sorted(got) if ends[g] > 0}


def crosscheck(r: StepResult, through: list[Sample], restarted: bool) -> dict[str, Any]:
    """What the GPUs counted against what the nodes counted, and the origins' body bytes
    the nodes counted against the bytes that came down their links to the origins.

    Not the latter in the cross-region steps: there the same links also carry the
    migrator's reads of staged copies, which a node counts (``lota_migrated_bytes``) only
    when a copy has landed, often in a later step, so the links cannot be matched per step."""
    gpus = Counter(s.source for s in through if s.ok)
    nodes = {src: node_sum(r.counters, "lota_cache_requests_total", source=src) for src in SOURCES}
    read_path = sum(s.size for s in through if s.ok and s.source in READ_PATH)
    counted = node_sum(r.counters, "lota_cache_bytes_total")
    body = node_sum(r.counters, "lota_origin_bytes_in_total")
    asked = node_sum(r.counters, "lota_origin_requests_total")
    wire = sum(v for k, v in r.links.items() if "node" in k and "origin (down)" in k)
    out: dict[str, Any] = {
        "reads_by_source": {"gpus": dict(gpus), "nodes": {k: v for k, v in nodes.items() if v}},
        "read_path_bytes": {"gpus": read_path, "nodes": counted},
        "origin_bytes": {"nodes_body": body, "links": wire, "origin_requests": asked},
        "reads_agree": all(gpus.get(src, 0) == nodes[src] for src in SOURCES),
        "bytes_agree": read_path == counted,
        "origin_agree": None
        if r.step.phase == "xregion-save"
        else body <= wire <= body + HEADER_ALLOWANCE * asked,
    }
    out["agree"] = out["reads_agree"] and out["bytes_agree"] and out["origin_agree"] is not False
    if restarted:
        out["note"] = (
            "a node was killed in this step: what it counted between its last scrape and "
            "the SIGKILL is lost with it"
        )
    return out


def build(
    args: argparse.Namespace,
    shape: Shape,
    sizes: Sizes,
    fleet: Fleet,
    results: Sequence[StepResult],
    restart: Restart | None,
    uploaded: int,
) -> dict[str, Any]:
    """Every figure of the run, as report.json holds them."""
    seen: set[tuple[str, int, int]] = set()
    steps = [
        step_figures(r, shape, seen, restart is not None and restart.step == r.step.name)
        for r in results
    ]
    t0 = min((r.started for r in results), default=0.0)
    samples = [
        [
            i,
            s.gpu,
            s.tag,
            s.write,
            s.source,
            s.size,
            round(s.start - t0, 4),
            round(s.seconds, 5),
            s.attempts,
            s.ok,
        ]
        for i, r in enumerate(results)
        for s in r.samples
    ]
    figures = {
        "run": {"machine_cpus": os.cpu_count(), "uploaded_bytes": uploaded},
        "settings": settings(args, shape, sizes, fleet, restart),
        "steps": steps,
        "summary": summarize(steps, restart, t0),
        "samples_columns": [
            "step",
            "gpu",
            "tag",
            "write",
            "source",
            "bytes",
            "start_s",
            "seconds",
            "attempts",
            "right",
        ],
        "samples": samples,
    }
    figures["checks"] = checks(figures)
    return figures


def settings(
    args: argparse.Namespace, shape: Shape, sizes: Sizes, fleet: Fleet, restart: Restart | None
) -> dict[str, Any]:
    return {
        "workload": args.workload,
        "quick": args.quick,
        "racks": shape.racks,
        "nodes_per_rack": shape.nodes_per_rack,
        "gpus_per_node": shape.gpus_per_node,
        "gpus": [asdict(g) for g in fleet.gpus],
        "dataset_over_cluster_cache": args.ratio if not args.cache_size else None,
        "cache_bytes_per_node": shape.cache_size,
        "chunk_size": shape.chunk_size,
        "links": {
            "near (to an origin of one's region)": asdict(shape.near),
            "far (between regions)": asdict(shape.far),
            "rack (between two racks)": asdict(shape.rack),
        },
        "sizes": asdict(sizes),
        "restart": asdict(restart) if restart else None,
    }


def summarize(steps: list[dict[str, Any]], restart: Restart | None, t0: float) -> dict[str, Any]:
    """The figures the tables show first, per workload."""
    named = {s["name"]: s for s in steps}
    out: dict[str, Any] = {
        "epochs": [
            {
                "epoch": s["name"],
                "byte_hit_rate": s["byte_hit_rate"],
                **s["shares"],
                "origin_bytes": sum(s["origin_bytes"].values()),
                "gbps": s["gbps"],
            }
            for s in steps
            if s["phase"] == "epochs" and not s["direct"]
        ],
    }
    if "restore" in named:
        s = named["restore"]
        served = s["peer_served_bytes_by_node"]
        out["restore"] = {
            "seconds": s["wall_s"],
            "gbps": s["gbps"],
            "unique_bytes": s["unique_bytes"],
            "origin_bytes": sum(s["origin_bytes"].values()),
            "origin_over_unique": s["origin_over_unique"],
            "peer_served_max_over_mean": max(served) / statistics.mean(served)
            if served and statistics.mean(served)
            else None,
        }
    if "save" in named:
        out["xregion"] = xregion(named)
    if restart is not None and restart.step in named:
        s = named[restart.step]
        out["restart"] = {
            **asdict(restart),
            "killed_at_s": restart.killed_at - t0,
            "down_s": restart.ready_at - restart.killed_at,
            "ops_retried": s["retried"],
            "ops_failed": s["failed"],
            "ops_wrong": s["wrong"],
            "peer_fallbacks": s["peer_fallbacks"],
            "origin_bytes": sum(s["origin_bytes"].values()),
        }
    return out


def xregion(named: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Save acknowledgement through LOTA against straight to the far origin; read-backs."""
    lota, direct = named["save"]["latency_ms"], named["save: origin direct"]["latency_ms"]
    through, straight = lota.get("write LOTA", {}), direct.get("write ORIGIN", {})
    out: dict[str, Any] = {
        "ack_ms_through_lota": through,
        "ack_ms_direct": straight,
        "p50_speedup": straight["p50"] / through["p50"]
        if through.get("n") and straight.get("n")
        else None,
        "migration": named["save"].get("migration"),
    }
    for name in ("read back (pending)", "read back (home)"):
        if name in named:
            out[name] = named[name]["latency_ms"]
    return out


def checks(figures: dict[str, Any]) -> dict[str, Any]:
    """What a run must show to be believed; the smoke test asserts them."""
    steps = figures["steps"]
    # Reads of objects already in the origin, which reach it only through cache fills.
    reading = [s for s in steps if s["phase"] in READ_PHASES]
    rates = [s["byte_hit_rate"] for s in steps if s["byte_hit_rate"] is not None]
    rates += [v for s in steps for v in s["shares"].values()]
    per_gpu: dict[int, list[bool]] = defaultdict(list)
    for row in figures["samples"]:
        per_gpu[row[1]].append(row[9])
    counted = [s for s in steps if not s["restart_here"]]
    out = {
        "origin_bytes": sum(sum(s["origin_bytes"].values()) for s in reading),
        "unique_bytes": sum(s["new_bytes"] for s in reading),
        "hit_rates_in_0_1": all(0.0 <= r <= 1.0 for r in rates),
        "gpus_with_reads": len(per_gpu),
        "every_gpu_read_right": len(per_gpu) == len(figures["settings"]["gpus"])
        and all(all(v) for v in per_gpu.values()),
        "reads_and_bytes_agree": all(
            s["crosscheck"]["reads_agree"] and s["crosscheck"]["bytes_agree"] for s in counted
        ),
        "origin_bytes_disagree_in": [
            s["name"] for s in steps if s["crosscheck"]["origin_agree"] is False
        ],
    }
    out["origin_ge_unique"] = out["origin_bytes"] >= out["unique_bytes"]
    wanted = (
        "origin_ge_unique",
        "hit_rates_in_0_1",
        "every_gpu_read_right",
        "reads_and_bytes_agree",
    )
    out["passed"] = all(out[k] for k in wanted)
    return out


def write(out: Path, figures: dict[str, Any]) -> list[Path]:
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(figures, indent=1) + "\n")
    md_path.write_text(markdown(figures))
    return [json_path, md_path]


def _ms(p: dict[str, float] | None) -> str:
    return f"{p['p50']:.1f} / {p['p99']:.1f}" if p and p.get("n") else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _mib(x: float) -> str:
    return f"{x / MiB:,.1f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def steps_table(figures: dict[str, Any]) -> str:
    """One row per step: what the GPUs got, from where, at what cost to the origin."""
    rows = []
    for s in figures["steps"]:
        lat = s["latency_ms"]
        origin = sum(s["origin_bytes"].values())
        rows.append(
            [
                s["name"],
                s["reads"] + s["writes"],
                f"{s['wall_s']:.1f}",
                _mib(s["gpu_bytes"] + s["direct_bytes"] + s["written_bytes"]),
                _mib(s["unique_bytes"]),
                _mib(origin),
                _pct(s["byte_hit_rate"]),
                " / ".join(_pct(s["shares"].get(k)) for k in ("HIT", "PEER", "MISS")),
                f"{s['gbps']:.2f}",
                " · ".join(f"{k} {_ms(v)}" for k, v in lat.items() if v.get("n")),
                f"{s['right']}/{s['reads'] + s['writes']}"
                + (f" ({s['retried']} retried)" if s["retried"] else ""),
            ]
        )
    return table(
        [
            "step",
            "ops",
            "s",
            "MiB moved",
            "unique MiB",
            "origin MiB",
            "byte hit rate",
            "HIT / PEER / MISS",
            "GB/s",
            "p50 / p99 ms by source",
            "right",
        ],
        rows,
    )


def markdown(figures: dict[str, Any]) -> str:
    run, st, summ = figures["run"], figures["settings"], figures["summary"]
    parts = [
        "# Simulated GPU cluster through LOTA\n",
        f"`{run.get('command', '')}`: {st['racks']} racks x {st['nodes_per_rack']} nodes x "
        f"{st['gpus_per_node']} GPUs, workload {st['workload']}; LOTA {run.get('lota_version')}; "
        f"{run.get('seconds', 0):.0f} s on {run['machine_cpus']} CPUs (load average "
        f"{run.get('load_before', [0])[0]:.2f} before, {run.get('load_after', [0])[0]:.2f} after). "
        f"Cache {_mib(st['cache_bytes_per_node'])} MiB per node, chunks {st['chunk_size']}.\n",
        "## Steps\n",
        steps_table(figures),
    ]
    if summ["epochs"]:
        parts += [
            "\n## Hit rate by epoch\n",
            table(
                ["epoch", "byte hit rate", "HIT", "PEER", "MISS", "origin MiB", "GB/s"],
                [
                    [
                        e["epoch"],
                        _pct(e["byte_hit_rate"]),
                        _pct(e.get("HIT")),
                        _pct(e.get("PEER")),
                        _pct(e.get("MISS")),
                        _mib(e["origin_bytes"]),
                        f"{e['gbps']:.2f}",
                    ]
                    for e in summ["epochs"]
                ],
            ),
        ]
    if "restore" in summ:
        r = summ["restore"]
        parts += [
            "\n## Checkpoint restore\n",
            table(
                [
                    "restore s",
                    "GB/s",
                    "unique MiB",
                    "origin MiB",
                    "origin / unique",
                    "peer bytes served max / mean",
                ],
                [
                    [
                        f"{r['seconds']:.1f}",
                        f"{r['gbps']:.2f}",
                        _mib(r["unique_bytes"]),
                        _mib(r["origin_bytes"]),
                        f"{r['origin_over_unique']:.2f}",
                        f"{r['peer_served_max_over_mean'] or 0:.2f}",
                    ]
                ],
            ),
        ]
    if "xregion" in summ:
        x = summ["xregion"]
        mig = x.get("migration") or {}
        parts += [
            "\n## Cross-region checkpoint saves\n",
            table(
                ["save acknowledged", "p50 / p99 ms"],
                [
                    ["through LOTA (staged in the near region)", _ms(x["ack_ms_through_lota"])],
                    ["straight to the far region", _ms(x["ack_ms_direct"])],
                ],
            ),
            f"\np50 {x['p50_speedup'] or 0:.1f}x sooner through LOTA; {mig.get('objects')} of "
            f"{mig.get('of')} saves home in the far origin "
            f"{mig.get('seconds_after_last_ack', 0):.1f} s after the last acknowledgement.\n",
        ]
    if "restart" in summ:
        r = summ["restart"]
        parts += [
            f"\n## Node restart\n\nNode {r['node']} killed (SIGKILL) {r['killed_at_s']:.1f} s into "
            f"the run, in the middle of {r['step']}, ready again {r['down_s']:.1f} s later. "
            f"In that step: {r['ops_retried']} reads tried again, {r['ops_failed']} failed, "
            f"{r['ops_wrong']} wrong; {r['peer_fallbacks']:.0f} chunk reads fell back past "
            "their owner.\n"
        ]
    parts += ["\n## Cross-check against the nodes' /_lota/metrics\n", crosscheck_table(figures)]
    c = figures["checks"]
    parts += ["\n## Checks\n", table(["check", "result"], [[k, v] for k, v in c.items()])]
    return "\n".join(parts)


def _counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items())) or "-"


def crosscheck_table(figures: dict[str, Any]) -> str:
    rows = []
    for s in figures["steps"]:
        c = s["crosscheck"]
        gpus, nodes = c["reads_by_source"]["gpus"], c["reads_by_source"]["nodes"]
        o = c["origin_bytes"]
        rows.append(
            [
                s["name"],
                _counts(gpus),
                _counts(nodes),
                f"{_mib(c['read_path_bytes']['gpus'])} / {_mib(c['read_path_bytes']['nodes'])}",
                f"{_mib(o['nodes_body'])} / {_mib(o['links'])}"
                + (" (migration on the links)" if c["origin_agree"] is None else ""),
                ("yes" if c["agree"] else "**no**") + (" (restart)" if s["restart_here"] else ""),
            ]
        )
    return table(
        [
            "step",
            "reads by source (GPUs)",
            "lota_cache_requests_total",
            "read-path MiB GPUs / lota_cache_bytes_total",
            "origin MiB body / link",
            "agree",
        ],
        rows,
    )


def summary(figures: dict[str, Any]) -> str:
    """What the terminal shows at the end."""
    c = figures["checks"]
    verdict = "all checks passed" if c["passed"] else f"CHECKS FAILED: {c}"
    return "\n" + steps_table(figures) + "\n" + verdict
