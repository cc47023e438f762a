"""``lota lifecycle``: the time it decides at, and the config it reads (no origin needed)."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lota.clock import Clock
from lota.errors import ConfigError
from lota.lifecycle.cli import load_config, parse_now, plan_command


def test_now_flag_wins_over_lota_time_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOTA_TIME_OFFSET", "30d")
    clock = Clock.from_environment()
    moment = datetime(2027, 3, 1, tzinfo=UTC).timestamp()
    assert parse_now("2027-03-01T00:00:00Z", clock) == moment
    assert parse_now("2027-03-01T00:00:00", clock) == moment  # no zone: UTC
    assert parse_now("2027-03-01T01:00:00+01:00", clock) == moment
    assert abs(parse_now(None, clock) - (datetime.now(UTC).timestamp() + 30 * 86400)) < 5
    with pytest.raises(ConfigError, match="--now"):
        parse_now("next tuesday", clock)


def test_the_lifecycle_section_is_read_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "lota.toml"
    path.write_text(
        'origin = "http://127.0.0.1:1"\n[auth]\nmode = "none"\n'
        '[lifecycle]\ninterval = "0"\nrate = 5\n[lifecycle.tiers]\narchive = "GLACIER"\n'
        '[[lifecycle.rules]]\nbucket = "ckpt"\nprefix = "runs/*/"\nkeep_latest = 3\n'
        'transitions = [ { days_since_last_access = 60, tier = "archive" } ]\n'
    )
    config, lifecycle = load_config(str(path))
    assert config.regions["us-east"].endpoint == "http://127.0.0.1:1"
    assert (lifecycle.interval, lifecycle.rate, lifecycle.tiers.archive) == (0, 5, "GLACIER")
    assert [r.name for r in lifecycle.rules] == ["ckpt/runs/*/"]


async def test_the_lifecycle_needs_a_catalog(tmp_path: Path) -> None:
    path = tmp_path / "lota.toml"
    path.write_text('origin = "http://127.0.0.1:1"\n[auth]\nmode = "none"\n')
    with pytest.raises(ConfigError, match=r"set \[catalog\] url \(LOTA_CATALOG_URL\)"):
        await plan_command(str(path), None, None, False, io.StringIO())
