"""The README's reference tables say what the code accepts and exports, no more, no less."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lota.config import settings
from lota.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MODEL_REPORT = ROOT / "docs" / "sim" / "model" / "report.json"


def _section(title: str) -> str:
    start = README.index(f"### {title}\n")
    end = README.find("\n#", start + 4)
    return README[start:end]


def test_the_configuration_reference_lists_every_setting_and_its_variable() -> None:
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", _section("Configuration reference"), re.M)
    assert len(rows) == len(set(rows)), "a setting listed twice"
    assert sorted(rows) == sorted((s.path, s.variable) for s in settings())


class _Store:
    def usage(self) -> int:
        return 0

    def budget(self) -> int:
        return 0

    def stats(self) -> dict[str, int]:
        return {}

    def dir_stats(self) -> dict[str, dict[str, int]]:
        return {"/d": {"bytes_used": 0, "free_bytes": 0, "budget": 0, "healthy": 1}}


def test_the_metrics_table_lists_every_metric_a_node_exports() -> None:
    metrics = Metrics()
    metrics.watch_store(_Store())
    exported = set()
    for family in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        exported.add(family.name + suffix)
    listed = set(re.findall(r"`(lota_[a-z_]+)", _section("Metrics")))
    assert listed == exported


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _rows(section: str) -> dict[str, list[str]]:
    """Each table row of `section` by its first cell, bold marks dropped."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_the_trace_models_figures_are_the_committed_reports() -> None:
    # The README's figures for `python -m bench.sim model` come from the run committed in
    # docs/sim/model/; a new run means a new report there and new figures here.
    report = json.loads(MODEL_REPORT.read_text(encoding="utf-8"))
    section = _section("Trace model at 15,000 GPUs")
    rows = _rows(section)
    s, head = report["settings"], report["headline"]
    assert (
        f"{s['sampled_reads']:,} sampled reads of {s['sampled_chunks']:,} chunks, "
        f"{s['nodes']:,} nodes, {s['membership_changes']} membership changes"
    ) in " ".join(section.split())
    for p in report["curve"]:
        c = p["s3fifo"]
        size = f"{p['cache_bytes'] / 10**15:g} PB ({p['cache_per_node_bytes'] / 10**12:.2f} TB)"
        assert rows[size] == [
            _pct(p["byte_hit_rate"]),
            _pct(p["object_hit_rate"]),
            f"{p['origin_over_distinct']:.3f}x",
            _pct(p["owner_miss_ratio"]),
            _pct(c["lota_miss_ratio"]),
            _pct(c["libcachesim_miss_ratio"]),
            f"{c['gap_points']:.2f} pts",
        ], size
    headline = f"{s['cache_bytes'] / 10**15:g} PB ({s['cache_per_node_bytes'] / 10**12:.2f} TB)"
    assert f"| **{headline}** | **{_pct(head['byte_hit_rate'])}** |" in section
    assert f"LOTA lands at {_pct(head['byte_hit_rate'])} at" in section
    what_if = {w["scenario"]: w for w in report["what_if"]}
    assert what_if["as documented"]["byte_hit_rate"] == head["byte_hit_rate"]
    for name, w in what_if.items():
        assert rows[name] == [_pct(w["byte_hit_rate"]), _pct(w["best_byte_hit_rate"])], name
