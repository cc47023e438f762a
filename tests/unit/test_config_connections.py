"""Connection settings and the origin timeout: parsed, defaulted, refused when out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from lota.config import Config, load
from lota.errors import ConfigError


def _load(tmp_path: Path, toml: str) -> Config:
    file = tmp_path / "lota.toml"
    file.write_text(
        f'{toml}\n[auth]\nmode = "none"\n[regions.us-east]\nendpoint = "http://127.0.0.1:9"\n'
    )
    return load(file, environ={})


def test_origin_timeout_defaults_to_10s_and_takes_durations(tmp_path: Path) -> None:
    assert _load(tmp_path, "").origin_timeout == 10.0
    assert _load(tmp_path, 'origin_timeout = "1500ms"').origin_timeout == 1.5


@pytest.mark.parametrize("value", ['"0s"', "0", '"soon"'])
def test_origin_timeout_must_be_a_positive_duration(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"origin_timeout|duration"):
        _load(tmp_path, f"origin_timeout = {value}")


def test_connection_settings_default_to_10s_75s_and_a_derived_cap(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    assert (config.header_timeout, config.keepalive_timeout, config.max_connections) == (
        10.0,
        75.0,
        0,
    )
    config = _load(
        tmp_path, 'header_timeout = "2s"\nkeepalive_timeout = "1m"\nmax_connections = 5000'
    )
    assert (config.header_timeout, config.keepalive_timeout, config.max_connections) == (
        2.0,
        60.0,
        5000,
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ('header_timeout = "0s"', "header_timeout"),
        ("keepalive_timeout = 0", "keepalive_timeout"),
        ("max_connections = -1", "max_connections"),
        ('max_connections = "many"', "max_connections"),
    ],
)
def test_connection_settings_are_checked(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, setting)
