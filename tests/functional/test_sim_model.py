"""``python -m bench.sim model --quick``: the trace model at 1,200 GPUs over two days,
through LOTA's ownership, eviction and admission code, cross-checked against libCacheSim,
and a report whose figures add up (the issue #14 smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOURCES = ("local", "owner", "origin")


def test_quick_model_writes_a_report_whose_figures_add_up(tmp_path: Path) -> None:
    out = tmp_path / "model"
    command = [sys.executable, "-m", "bench.sim", "model", "--quick", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    headline = report["headline"]
    assert f"byte hit rate {headline['byte_hit_rate']:.2%}" in done.stdout

    assert {"lota_version", "settings", "mix", "trace", "curve", "what_if"} <= report.keys()
    settings = report["settings"]
    assert settings["nodes"] == settings["gpus"] // 8 and settings["membership_changes"] > 0
    assert 0 < settings["sampling_rate"] < 1 and settings["sampled_reads"] > 10_000

    points = [*report["curve"], headline]
    for point in points:
        for rate in ("byte_hit_rate", "object_hit_rate", "owner_miss_ratio"):
            assert 0.0 <= point[rate] <= 1.0
        for unit in ("bytes", "reads"):
            shares = [point[unit][s] for s in SOURCES]
            assert all(0.0 <= s <= 1.0 for s in shares)
            assert sum(shares) == pytest.approx(1.0)
        assert point["byte_hit_rate"] == pytest.approx(1 - point["bytes"]["origin"])
        # Every distinct chunk came from the origin at least once.
        assert point["origin_bytes"] >= point["distinct_bytes"] * (1 - 1e-9)
        assert point["node_load_max_over_mean"] >= 1.0
        # LOTA's S3-FIFO and libCacheSim's, on the same owner reads, agree within a point.
        check = point["s3fifo"]
        assert check["gap_points"] <= 1.0 and check["within_1_point"] is True

    # More cache never hits less, and a quarter of the cache hits clearly less: the store's
    # real eviction ran against a budget (it is not an unbounded cache).
    rates = [p["byte_hit_rate"] for p in report["curve"]]
    assert rates == sorted(rates)
    assert rates[0] < rates[-1] - 0.05
    assert rates[0] < report["what_if"][0]["best_byte_hit_rate"]
    # ...and the origin sent more than the distinct bytes when the cache was too small.
    assert report["curve"][0]["origin_over_distinct"] > 1.1

    # No LOTA figure beats the best any cache could do, and taking churn or ingest away
    # never lowers what is possible.
    what_if = {w["scenario"]: w for w in report["what_if"]}
    assert set(what_if) == {"as documented", "no churn", "no ingest", "neither"}
    for w in what_if.values():
        assert 0.0 <= w["byte_hit_rate"] <= w["best_byte_hit_rate"] + 1e-9 <= 1.0 + 1e-9
    best = {name: w["best_byte_hit_rate"] for name, w in what_if.items()}
    assert best["as documented"] <= min(best["no churn"], best["no ingest"]) <= best["neither"]

    md = (out / "report.md").read_text()
    assert "## Hit rate against cache size" in md and "libCacheSim" in md and "## What if" in md
    png = (out / "model-hit-rate-vs-cache.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
