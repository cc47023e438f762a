"""Configuration: every setting has a ``LOTA_*`` variable by one rule, values are checked by
kind wherever they come from, and a variable that is not a setting is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lota.config import Config, load, settings
from lota.errors import ConfigError
from lota.lifecycle.rules import Rule, Transition

ORIGIN = {"LOTA_ORIGIN": "http://127.0.0.1:1"}

# One value per setting a variable can set, as written in the variable, and where it lands.
# A setting added to the config without a line here fails test_every_setting_is_covered.
SAMPLES: dict[str, tuple[str, Any]] = {
    "listen": ("0.0.0.0:9100", lambda c: c.listen == "0.0.0.0:9100"),
    "region": ("eu-west", lambda c: c.region == "eu-west" and "eu-west" in c.regions),
    "domain": ("s3.example", lambda c: c.domain == "s3.example"),
    "node": ("gpu-17", lambda c: c.node == "gpu-17"),
    "workers": ("4", lambda c: c.workers == 4 and c.worker_count == 4),
    "scheduling": ("normal", lambda c: c.scheduling == "normal"),
    "drain_timeout": ("2m", lambda c: c.drain_timeout == 120.0),
    "body_timeout": ("90", lambda c: c.body_timeout == 90.0),
    "header_timeout": ("3s", lambda c: c.header_timeout == 3.0),
    "keepalive_timeout": ("1m", lambda c: c.keepalive_timeout == 60.0),
    "max_connections": ("5000", lambda c: c.max_connections == 5000),
    "origin_timeout": ("500ms", lambda c: c.origin_timeout == 0.5),
    "tls_cert": ("/etc/lota/cert.pem", lambda c: c.tls_cert == "/etc/lota/cert.pem"),
    "tls_key": ("/etc/lota/key.pem", lambda c: c.tls_key == "/etc/lota/key.pem"),
    "log_level": ("DEBUG", lambda c: c.log_level == "DEBUG"),
    "origin": ("http://10.0.0.9:9000", lambda c: c.home_region("x").endpoint.endswith(":9000")),
    "cache.dirs": (
        "/nvme0/lota, /nvme1/lota",
        lambda c: c.cache.dirs == ("/nvme0/lota", "/nvme1/lota"),
    ),
    "cache.size": ("2TiB", lambda c: c.cache.size == 2 * 1024**4),
    "cache.chunk_size": ("16MiB", lambda c: c.cache.chunk_size == 16 * 1024**2),
    "cache.verify": ("always", lambda c: c.cache.verify == "always"),
    "cache.revalidate_after": ("5m", lambda c: c.cache.revalidate_after == 300.0),
    "cache.revalidate": (
        "datasets/live/=10s,ckpt/=1h",
        lambda c: c.cache.revalidate == (("datasets/live/", 10.0), ("ckpt/", 3600.0)),
    ),
    "cache.immutable": ("/ckpt/runs/", lambda c: c.cache.immutable == ("ckpt/runs/",)),
    "cache.pinned": ("models/base/", lambda c: c.cache.pinned == ("models/base/",)),
    "cache.stale_if_error": ("2h", lambda c: c.cache.stale_if_error == 7200.0),
    "cache.readahead": ("8", lambda c: c.cache.readahead == 8),
    "cache.fill_concurrency": ("16", lambda c: c.cache.fill_concurrency == 16),
    "cache.scrub_interval": ("0", lambda c: c.cache.scrub_interval == 0.0),
    "cache.fsync": ("false", lambda c: c.cache.fsync is False),
    "cache.high_watermark": ("0.99", lambda c: c.cache.high_watermark == 0.99),
    "cache.low_watermark": ("0.8", lambda c: c.cache.low_watermark == 0.8),
    "auth.mode": ("none", lambda c: c.auth.mode == "none"),
    "auth.credentials": ("/etc/lota/creds.toml", lambda c: c.auth.credentials.endswith("s.toml")),
    "auth.max_skew": ("5m", lambda c: c.auth.max_skew == 300.0),
    "catalog.url": ("sqlite:////tmp/c.db", lambda c: c.catalog.url == "sqlite:////tmp/c.db"),
    "write.staging": ("local-disk", lambda c: c.write.staging == "local-disk"),
    "write.staging_dir": ("/nvme0/staging", lambda c: c.write.staging_dir == "/nvme0/staging"),
    "write.migrate_concurrency": ("16", lambda c: c.write.migrate_concurrency == 16),
    "write.part_concurrency": ("2", lambda c: c.write.part_concurrency == 2),
    "write.migrate_bandwidth": ("100MB", lambda c: c.write.migrate_bandwidth == 10**8),
    "write.lease": ("2m", lambda c: c.write.lease == 120.0),
    "write.staging_grace": ("30s", lambda c: c.write.staging_grace == 30.0),
    "write.create_staging": ("true", lambda c: c.write.create_staging is True),
    "lifecycle.interval": ("6h", lambda c: c.lifecycle.interval == 6 * 3600.0),
    "lifecycle.rate": ("2.5", lambda c: c.lifecycle.rate == 2.5),
    "lifecycle.lease": ("90s", lambda c: c.lifecycle.lease == 90.0),
    "lifecycle.tiers.hot": ("STD", lambda c: c.lifecycle.tiers.hot == "STD"),
    "lifecycle.tiers.warm": ("IA", lambda c: c.lifecycle.tiers.warm == "IA"),
    "lifecycle.tiers.cold": ("COLD", lambda c: c.lifecycle.tiers.cold == "COLD"),
    "lifecycle.tiers.archive": ("DEEP", lambda c: c.lifecycle.tiers.archive == "DEEP"),
    "lifecycle.rules": (
        json.dumps(
            [{"bucket": "ckpt", "transitions": [{"days_since_last_access": 7, "tier": "cold"}]}]
        ),
        lambda c: (
            c.lifecycle.rules == (Rule(bucket="ckpt", transitions=(Transition(7.0, "cold"),)),)
        ),
    ),
    "lifecycle.restore_on_read": ("yes", lambda c: c.lifecycle.restore_on_read is True),
    "lifecycle.restore_days": ("3", lambda c: c.lifecycle.restore_days == 3),
    "lifecycle.restore_tier": ("Bulk", lambda c: c.lifecycle.restore_tier == "Bulk"),
    "cluster.self": ("10.0.0.5:9000", lambda c: c.cluster.self == "10.0.0.5:9000"),
    "cluster.members": (
        "10.0.0.5:9000, 10.0.0.6:9000",
        lambda c: c.cluster.members == ("10.0.0.5:9000", "10.0.0.6:9000") and c.cluster.on,
    ),
    "cluster.dns": ("lota-peers.lota.svc:9000", lambda c: c.cluster.dns.endswith(":9000")),
    "cluster.refresh": ("10s", lambda c: c.cluster.refresh == 10.0),
    "cluster.secret": ("0123456789abcdef-x", lambda c: c.cluster.secret == "0123456789abcdef-x"),
    "cluster.secret_file": ("/run/secrets/lota", lambda c: c.cluster.secret == SECRET),
    "cluster.grace": ("2m", lambda c: c.cluster.grace == 120.0),
    "cluster.timeout": ("500ms", lambda c: c.cluster.timeout == 0.5),
    "cluster.hot_reads": ("3", lambda c: c.cluster.hot_reads == 3),
    "cluster.hot_window": ("1m", lambda c: c.cluster.hot_window == 60.0),
    "cluster.hot_share": ("0.25", lambda c: c.cluster.hot_share == 0.25),
    "cluster.rack": ("r7", lambda c: c.cluster.rack == "r7"),
    "cluster.dial": (
        "10.0.1.5:9000=127.0.0.1:7001",
        lambda c: c.cluster.dial == (("10.0.1.5:9000", "127.0.0.1:7001"),),
    ),
    "regions.NAME.endpoint": ("http://10.1.0.1:9000", None),
    "regions.NAME.access_key_id": ("AKFAR", None),
    "regions.NAME.secret_access_key": ("far-secret", None),
    "regions.NAME.signing_region": ("eu-west-1", None),
    "regions.NAME.staging_bucket": ("staging-eu", None),
    "buckets.default_region": ("us-east", lambda c: c.default_region == "us-east"),
    "buckets": ("ckpt=us-east", lambda c: c.bucket_regions == {"ckpt": "us-east"}),
}

# Settings that need another one set with them.
SECRET = "a-cluster-secret-of-the-right-length"
CLUSTER = {"LOTA_CLUSTER_MEMBERS": "127.0.0.1:9000", "LOTA_CLUSTER_SECRET": SECRET}
COMPANIONS = {
    **{
        f"cluster.{name}": CLUSTER
        for name in ("self", "refresh", "secret_file", "grace", "timeout", "hot_reads")
    },
    **{f"cluster.{name}": CLUSTER for name in ("hot_window", "hot_share", "rack", "dial")},
    "cluster.members": {"LOTA_CLUSTER_SECRET": SECRET},
    "cluster.dns": {"LOTA_CLUSTER_SECRET": SECRET},
    "cluster.secret": {"LOTA_CLUSTER_MEMBERS": "127.0.0.1:9000"},
    "tls_cert": {"LOTA_TLS_KEY": "/k.pem"},
    "tls_key": {"LOTA_TLS_CERT": "/c.pem"},
    "write.staging": {"LOTA_WRITE_STAGING_DIR": "/s"},
}


def test_every_setting_is_covered_and_its_variable_follows_the_rule() -> None:
    paths = [s.path for s in settings()]
    assert sorted(paths) == sorted(SAMPLES)
    variables = {s.path: s.variable for s in settings()}
    assert variables["cache.chunk_size"] == "LOTA_CACHE_CHUNK_SIZE"
    assert variables["lifecycle.tiers.archive"] == "LOTA_LIFECYCLE_TIERS_ARCHIVE"
    assert variables["buckets.default_region"] == "LOTA_BUCKETS_DEFAULT_REGION"
    assert variables["catalog.url"] == "LOTA_CATALOG_URL"


@pytest.mark.parametrize("path", [p for p, (_, check) in SAMPLES.items() if check])
def test_each_setting_comes_from_its_variable(path: str) -> None:
    variable = next(s.variable for s in settings() if s.path == path)
    text, check = SAMPLES[path]
    config = load(environ={**ORIGIN, **COMPANIONS.get(path, {}), variable: text})
    assert check(config), (variable, text)


def test_region_variables_join_the_files_region_or_make_a_new_one(tmp_path: Path) -> None:
    toml = tmp_path / "lota.toml"
    toml.write_text(
        'region = "us-east"\n'
        '[regions.us-east]\nendpoint = "http://10.0.0.1:9000"\n'
        '[regions.eu_far]\nendpoint = "http://10.0.0.2:9000"\n'
    )
    config = load(
        toml,
        environ={
            "LOTA_REGIONS_US_EAST_STAGING_BUCKET": "staging-us",
            "LOTA_REGIONS_EU_FAR_SECRET_ACCESS_KEY": "s3cr3t",
            "LOTA_REGIONS_AP_SOUTH_1_ENDPOINT": "http://10.0.0.3:9000",
            "LOTA_BUCKETS": "logs=ap-south-1, ckpt = eu_far",
        },
    )
    assert config.regions["us-east"].staging_bucket == "staging-us"
    assert config.regions["us-east"].endpoint == "http://10.0.0.1:9000"
    assert config.regions["eu_far"].secret_access_key == "s3cr3t"
    assert config.regions["ap-south-1"].endpoint == "http://10.0.0.3:9000"
    assert config.bucket_regions == {"logs": "ap-south-1", "ckpt": "eu_far"}


def test_variables_win_over_the_file_and_flags_over_variables(tmp_path: Path) -> None:
    toml = tmp_path / "lota.toml"
    toml.write_text('origin = "http://127.0.0.1:1"\n[cache]\nreadahead = 2\nsize = "1GiB"\n')
    config = load(
        toml,
        environ={"LOTA_CACHE_READAHEAD": "6", "LOTA_CACHE_SIZE": "2GiB"},
        overrides={"cache.size": "3GiB"},
    )
    assert (config.cache.readahead, config.cache.size) == (6, 3 * 1024**3)


def test_the_serving_processes_run_as_batch_work_by_default() -> None:
    assert load(environ=ORIGIN).scheduling == "batch"
    assert load(environ={**ORIGIN, "LOTA_SCHEDULING": ""}).scheduling == "batch"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LOTA_CACHE_READAHEAD", "abc", "LOTA_CACHE_READAHEAD must be a whole number, got 'abc'"),
        ("LOTA_CACHE_SIZE", "lots", "LOTA_CACHE_SIZE: not a size: 'lots'"),
        ("LOTA_CACHE_FSYNC", "maybe", "LOTA_CACHE_FSYNC must be true or false, got 'maybe'"),
        ("LOTA_DRAIN_TIMEOUT", "soon", "LOTA_DRAIN_TIMEOUT: not a duration: 'soon'"),
        ("LOTA_CACHE_DIRS", "/a:/b", "cache.dirs: '/a:/b' has a ':'"),
        ("LOTA_BUCKETS", "ckpt", "LOTA_BUCKETS must be KEY=VALUE pairs"),
        ("LOTA_LIFECYCLE_RULES", "[{", "LOTA_LIFECYCLE_RULES must be JSON"),
        ("LOTA_SCHEDULING", "fifo", 'scheduling must be "batch" or "normal"'),
    ],
)
def test_a_bad_value_in_a_variable_is_refused_naming_it(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={**ORIGIN, variable: value})
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("LOTA_CATALOG", "did you mean LOTA_CATALOG_URL?"),
        ("LOTA_WRITE_CATALOG", "did you mean LOTA_CATALOG_URL?"),
        ("LOTA_CACHE_READAHAED", "did you mean LOTA_CACHE_READAHEAD?"),
        ("LOTA_REGIONS_EU_ENDPIONT", ""),
        ("LOTA_WHATEVER", ""),
    ],
)
def test_a_lota_variable_that_is_not_a_setting_is_refused(variable: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={**ORIGIN, variable: "x"})
    message = str(info.value)
    assert message.startswith(f"unknown variable {variable}: settings come from LOTA_<SECTION>_")
    assert message.endswith(hint)


def test_variables_that_are_not_settings_and_empty_ones_are_let_through() -> None:
    environ = {
        **ORIGIN,
        "LOTA_CONFIG": "",
        "LOTA_ENDPOINT": "http://127.0.0.1:9000",
        "LOTA_TIME_OFFSET": "30d",
        "LOTA_WHATEVER": "",
    }
    assert load(environ=environ).regions


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[cache]\nreadahead = 'abc'\n", "cache.readahead must be a whole number, got 'abc'"),
        ("[cache]\nfsync = 1\n", "cache.fsync must be true or false, got 1"),
        ("[cache]\ndirs = [1, 2]\n", "cache.dirs must be a list of strings"),
        ("listen = 9000\n", "listen must be a string, got 9000"),
        ("[write]\nlease = true\n", "write.lease must be a duration"),
        ("cache = 5\n", "cache must be a table"),
        ("[regions.x]\nendpoint = 5\n", "regions.x.endpoint must be a string"),
        ("[cache]\nreadahed = 4\n", "unknown setting(s) in cache: readahed"),
    ],
)
def test_a_bad_value_in_the_file_is_refused_naming_the_setting(
    toml: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "lota.toml"
    path.write_text('origin = "http://127.0.0.1:1"\n' + toml)
    with pytest.raises(ConfigError) as info:
        load(path, environ={})
    assert str(info.value).startswith(message)


def test_what_serving_needs_is_checked_apart_from_what_every_command_needs() -> None:
    """lota migrations reads the catalog only: no origin and no client credentials needed."""
    config = load(environ={"LOTA_CATALOG_URL": "sqlite:////tmp/c.db"})
    assert config.catalog.url and not config.regions
    with pytest.raises(ConfigError, match="no origin configured"):
        config.require_serving()
    with pytest.raises(ConfigError, match=r"needs auth.credentials.*lota credentials new FILE"):
        load(environ=ORIGIN).require_serving()
    load(environ={**ORIGIN, "LOTA_AUTH_MODE": "none"}).require_serving()
    assert isinstance(load(environ={**ORIGIN, "LOTA_AUTH_MODE": "none"}), Config)


TWO_REGIONS = (
    '[auth]\nmode = "none"\n[catalog]\nurl = "sqlite:////tmp/c.db"\n'
    '[regions.us-east]\nendpoint = "http://127.0.0.1:1"\n'
    '[regions.eu-west]\nendpoint = "http://127.0.0.1:2"\n'
)


@pytest.mark.parametrize(
    ("toml", "accelerates"),
    [
        ("", False),  # every bucket is homed here
        ('[buckets]\n"far" = "eu-west"\n', True),
        ('[buckets]\ndefault_region = "eu-west"\n"near" = "us-east"\n', True),
        ('[buckets]\n"near" = "us-east"\n', False),
    ],
)
def test_write_acceleration_is_on_with_a_catalog_and_a_bucket_homed_in_another_region(
    toml: str, accelerates: bool, tmp_path: Path
) -> None:
    path = tmp_path / "lota.toml"
    path.write_text(TWO_REGIONS + toml)
    config = load(path, environ={})
    assert config.accelerates_writes is accelerates
    assert config.accelerated("far") is accelerates
    assert config.accelerated("near") is False
    if accelerates:
        with pytest.raises(ConfigError, match=r"needs regions\.us-east\.staging_bucket"):
            config.require_serving()
    else:
        config.require_serving()
    without_catalog = load(path, environ={}, overrides={"catalog.url": ""})
    assert not without_catalog.accelerates_writes and not without_catalog.accelerated("far")


def test_a_single_region_catalog_for_the_lifecycle_needs_no_staging_bucket() -> None:
    rules = [{"bucket": "ckpt", "transitions": [{"days_since_last_access": 60, "tier": "cold"}]}]
    config = load(
        environ={
            **ORIGIN,
            "LOTA_AUTH_MODE": "none",
            "LOTA_CATALOG_URL": "postgresql://lota@db:5432/lota",
            "LOTA_LIFECYCLE_RULES": json.dumps(rules),
        }
    )
    assert config.write.staging == "bucket" and not config.regions["us-east"].staging_bucket
    config.require_serving()
    assert config.catalog.url.startswith("postgresql://") and not config.accelerates_writes


@pytest.mark.parametrize(
    ("toml", "environ", "message"),
    [
        (
            '[write]\ncatalog = "sqlite:////tmp/c.db"\n',
            {},
            "write.catalog has moved: set [catalog] url (LOTA_CATALOG_URL)",
        ),
        ("", {"LOTA_WRITE_CATALOG": "sqlite:////tmp/c.db"}, "did you mean LOTA_CATALOG_URL?"),
        ("", {"LOTA_CATALOG": "sqlite:////tmp/c.db"}, "did you mean LOTA_CATALOG_URL?"),
        ('[catalog]\nurl = "mysql://db"\n', {}, "catalog.url must be a sqlite:// or postgresql://"),
    ],
)
def test_the_old_catalog_settings_are_refused_naming_the_new_one(
    toml: str, environ: dict[str, str], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "lota.toml"
    path.write_text('origin = "http://127.0.0.1:1"\n' + toml)
    with pytest.raises(ConfigError) as info:
        load(path, environ=environ)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_cluster_needs_a_secret_and_an_address_peers_can_reach(tmp_path: Path) -> None:
    members = {"LOTA_CLUSTER_MEMBERS": "10.0.0.5:9000,10.0.0.6:9000"}
    with pytest.raises(ConfigError, match=r"cluster\.secret"):
        load(environ={**ORIGIN, **members})
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load(environ={**ORIGIN, **members, "LOTA_CLUSTER_SECRET": "short"})
    with pytest.raises(ConfigError, match=r"set cluster\.self"):
        load(environ={**ORIGIN, **CLUSTER, "LOTA_LISTEN": "0.0.0.0:9000"})
    with pytest.raises(ConfigError, match="one at a time"):
        load(environ={**ORIGIN, **CLUSTER, "LOTA_CLUSTER_DNS": "peers:9000"})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load(environ={**ORIGIN, **CLUSTER, "LOTA_CLUSTER_MEMBERS": "10.0.0.5"})
    # self defaults to the listen address when that is one peers can reach.
    config = load(environ={**ORIGIN, **CLUSTER, "LOTA_LISTEN": "10.0.0.5:9100"})
    assert config.cluster.self == "10.0.0.5:9100"
    assert SECRET not in repr(config)
    # No [cluster]: a node alone, needing no secret.
    assert not load(environ=ORIGIN).cluster.on


def test_the_cluster_secret_is_read_from_its_file_once(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    toml = tmp_path / "lota.toml"
    toml.write_text(f'[cluster]\nmembers = ["127.0.0.1:9000"]\nsecret_file = "{secret}"\n')
    assert load(toml, environ=ORIGIN).cluster.secret == SECRET
    toml.write_text(f'[cluster]\nmembers = ["127.0.0.1:9000"]\nsecret_file = "{tmp_path}/no"\n')
    with pytest.raises(ConfigError, match=r"cluster\.secret_file: cannot read"):
        load(toml, environ=ORIGIN)
