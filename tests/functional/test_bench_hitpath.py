"""bench.hitpath times what it says: every presigned URL of its hot set, read three times
through a real node, is answered again from its bytes, with each part left out in turn."""

from __future__ import annotations

from pathlib import Path

from bench.hitpath import PARTS, measure


async def test_every_url_is_answered_again_and_each_part_left_out_is_timed(tmp_path: Path) -> None:
    row = await measure(40, 400, tmp_path)
    assert row["answered_again"] == 1.0
    assert row["opens_per_answer"] == 0  # 40 chunk descriptors are all kept
    assert row["us"] > 0
    for part in PARTS:
        assert row[f"us without {part}"] > 0
