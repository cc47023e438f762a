"""``python -m bench.sim run --quick``: real LOTA nodes in two racks, simulated GPUs reading
through them, and a report whose figures add up (the issue #14 smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GPUS = 2 * 1 * 2  # racks x nodes per rack x GPUs per node


def test_quick_mixed_run_writes_a_report_whose_figures_add_up(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_"))}
    command = [sys.executable, "-m", "bench.sim", "run", "--racks", "2", "--nodes-per-rack"]
    command += ["1", "--gpus-per-node", "2", "--workload", "mixed", "--quick", "--out", str(out)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=150, env=env, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all checks passed" in done.stdout
    assert "hit rate so far" in done.stdout  # the progress line

    report = json.loads((out / "report.json").read_text())
    assert {"run", "settings", "steps", "summary", "checks", "samples"} <= report.keys()
    assert report["settings"]["racks"] == 2 and len(report["settings"]["gpus"]) > GPUS
    steps = {s["name"]: s for s in report["steps"]}
    wanted = {"epoch 1", "epoch 2", "restore", "agents", "save", "save: origin direct"}
    assert wanted | {"read back (pending)", "read back (home)"} <= steps.keys()

    checks = report["checks"]
    assert checks["passed"] is True
    assert checks["hit_rates_in_0_1"] and checks["every_gpu_read_right"]
    assert checks["gpus_with_reads"] == len(report["settings"]["gpus"])
    # Every read the GPUs made was counted by the nodes, by source and in bytes.
    assert checks["reads_and_bytes_agree"] is True
    assert all(s["wrong"] == 0 and s["failed"] == 0 for s in report["steps"])

    # Epoch 2 comes from the cluster's cache: no origin bytes, and a far higher hit rate.
    one, two = report["summary"]["epochs"][:2]
    assert one["byte_hit_rate"] < 0.2 and two["byte_hit_rate"] >= 0.9
    assert two["MISS"] == 0.0 and one["HIT"] == 0.0
    # The origin sent each byte of the dataset about once, and the links to the origins
    # carried what the nodes' own metrics say they received.
    first = steps["epoch 1"]
    assert first["unique_bytes"] <= sum(first["origin_bytes"].values())
    assert sum(first["origin_bytes"].values()) <= 1.1 * first["unique_bytes"]
    assert first["crosscheck"]["agree"] is True
    assert first["crosscheck"]["origin_agree"] is True
    assert checks["origin_bytes"] >= checks["unique_bytes"] > 0
    assert checks["origin_bytes"] <= 3 * checks["unique_bytes"]

    # Saves: acknowledged through LOTA, then home in the far region.
    x = report["summary"]["xregion"]
    assert x["ack_ms_through_lota"]["n"] == x["ack_ms_direct"]["n"] > 0
    assert x["migration"]["complete"] is True
    # The node killed mid-step came back, and no read came back wrong.
    assert report["summary"]["restart"]["ops_wrong"] == 0

    md = (out / "report.md").read_text()
    assert "## Hit rate by epoch" in md and "## Cross-check against" in md
    plots = sorted(out.glob("*.png"))
    assert len(plots) >= 4
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
