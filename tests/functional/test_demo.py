"""``make demo`` as a newcomer reads it: every figure says what it means."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_make_demo_prints_ratios_a_baseline_and_why_small_shards_stay_out_of_the_plan() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_"))}
    done = subprocess.run(
        [sys.executable, "-m", "bench.demo", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in out + done.stderr
    number = r"\d+\.\d"
    assert re.search(
        rf"epoch 2 from the cache: {number}x faster than epoch 1, {number}x faster", out
    )
    assert re.search(r"\| epoch 2 via LOTA \| [\d.]+s \| 8 HIT \|", out)
    # The checkpoint restore has its baseline, and the cache read the origin once for 8.
    assert re.search(r"\| from the origin directly \| [\d.]+s \| 128 MiB \|", out)
    assert re.search(r"\| through LOTA, cold \| [\d.]+s \| 16 MiB \|", out), out
    assert "every reader got identical bytes: True; LOTA read the origin 1.0 times" in out
    assert re.search(rf"acknowledged {number}x sooner through LOTA than straight to eu-west", out)
    assert "landed in eu-west" in out
    assert "not in the plan: the 64 KiB shards (train-000, train-004)" in out
    planned = re.findall(r"imagenet/(train-\d+)\.tar\thot\tarchive", out)
    assert sorted(planned) == [f"train-00{i}" for i in (1, 2, 3, 5, 6, 7)]
    assert 'lota_cache_requests_total{source="HIT"}' in out
