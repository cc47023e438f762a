"""LOTA's configuration: frozen, typed, validated once, loaded from TOML + environment + flags.

Precedence, lowest first: built-in defaults, the TOML file (``--config``), ``LOTA_*``
environment variables, command-line flags. Nothing else reads configuration; the rest of
the code receives a :class:`Config` (or the part of it it needs).

Sizes accept ``"10GiB"``, ``"512MB"``, ``"8MiB"`` or a plain byte count; durations accept
``"30s"``, ``"5m"``, ``"1h"``, ``"60d"`` or a plain number of seconds.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.config import from_toml as lifecycle_from_toml
from lota.s3.addressing import is_valid_bucket_name

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ConfigError(ValueError):
    """The configuration is invalid; the message says which setting and why."""


class StartupError(Exception):
    """LOTA cannot start: the message is the whole line ``lota`` prints (after ``lota: ``)
    before it exits with status 2, e.g. a cache directory another process holds."""


def parse_size(value: str | int) -> int:
    """``"10GiB"`` -> 10737418240. Plain integers are bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {value!r} (use e.g. 512MiB, 10GiB, 1TiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_duration(value: str | float) -> float:
    """``"30s"`` -> 30.0, ``"60d"`` -> 5184000.0. Plain numbers are seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(value))
    if not match or match.group(2) not in _DURATION_UNITS:
        raise ConfigError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h, 60d)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9000"`` -> ("127.0.0.1", 9000); ``"[::1]:9000"`` works too."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionConfig:
    """One region: the origin that holds the buckets homed there, and LOTA's credentials for it."""

    name: str
    endpoint: str
    access_key_id: str = ""
    secret_access_key: str = ""
    # The region name the origin expects in signatures. LOTA's region names are labels of
    # your choosing; most S3-compatible stores accept "us-east-1", AWS wants the real one.
    signing_region: str = "us-east-1"
    # A bucket in this region where accelerated writes wait for migration (write acceleration).
    staging_bucket: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^/\s]+/?", self.endpoint):
            raise ConfigError(
                f"regions.{self.name}.endpoint must be http(s)://host[:port], got {self.endpoint!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The node-local read cache (one directory per drive, one byte budget over all of them)."""

    dirs: tuple[str, ...] = ()
    size: int = 10 * 1024**3
    chunk_size: int = 8 * 1024**2
    # Check each chunk's xxh3 digest on every read, on the first read after a restart, or never.
    verify: Literal["always", "after-restart", "never"] = "after-restart"
    # Seconds after which a cached object is checked against the origin before use...
    revalidate_after: float = 30.0
    # ...with per-prefix overrides ("bucket/prefix", seconds), first match wins...
    revalidate: tuple[tuple[str, float], ...] = ()
    # ...and prefixes ("bucket/prefix") whose objects never change (checkpoints): never checked.
    immutable: tuple[str, ...] = ()
    # Prefixes ("bucket/prefix") never evicted.
    pinned: tuple[str, ...] = ()
    # How long past revalidate_after a copy may be served STALE while the origin is unreachable.
    stale_if_error: float = 3600.0
    # Chunks fetched ahead of a sequential range reader.
    readahead: int = 4
    # Seconds between background digest checks of idle chunks (0: off).
    scrub_interval: float = 3600.0
    # fsync each chunk before it becomes servable (survives power loss, not just kill -9).
    fsync: bool = True
    # Start evicting when usage passes high_watermark x size; evict down to low_watermark x size.
    high_watermark: float = 0.95
    low_watermark: float = 0.90

    def __post_init__(self) -> None:
        # Prefix lists are matched with str.startswith(tuple): keep them tuples whatever
        # the caller passed.
        for name in ("dirs", "immutable", "pinned", "revalidate"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.verify not in ("always", "after-restart", "never"):
            raise ConfigError('cache.verify must be "always", "after-restart" or "never"')
        if self.chunk_size < 64 * 1024 or self.chunk_size & (self.chunk_size - 1):
            raise ConfigError("cache.chunk_size must be a power of two of at least 64KiB")
        if self.dirs and self.size < 4 * self.chunk_size:
            raise ConfigError("cache.size must hold at least four chunks")
        if not 0 < self.low_watermark < self.high_watermark <= 1:
            raise ConfigError("cache watermarks need 0 < low_watermark < high_watermark <= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """How clients prove who they are: SigV4 against a credentials file, or nothing at all."""

    mode: Literal["sigv4", "none"] = "sigv4"
    credentials: str = ""
    # The largest difference between a request's x-amz-date and our clock (S3 allows 15 min).
    max_skew: float = 900.0

    def __post_init__(self) -> None:
        if self.mode not in ("sigv4", "none"):
            raise ConfigError(f'auth.mode must be "sigv4" or "none", got {self.mode!r}')
        if self.mode == "sigv4" and not self.credentials:
            raise ConfigError('auth.mode = "sigv4" needs auth.credentials (a credentials file)')


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteConfig:
    """Cross-region write acceleration: the shared catalog, staging, and the migrator."""

    # "sqlite:////abs/path.db" (embedded; one machine) or "postgresql://..." (a cluster).
    # Empty: no catalog, writes to far buckets go straight to their home origin.
    catalog: str = ""
    # "bucket": the local region's staging_bucket (durable, readable from every node);
    # "local-disk": `staging_dir` on this node (single-node use: lost with the disk).
    staging: Literal["bucket", "local-disk"] = "bucket"
    staging_dir: str = ""
    # Objects migrated at once, parts of one object at once, and their bandwidth cap
    # (bytes/s over all migrations; 0: none).
    migrate_concurrency: int = 4
    part_concurrency: int = 4
    migrate_bandwidth: int = 0
    # A migration lease lasts this long unless renewed; a dead node's work moves on after it.
    lease: float = 60.0
    # Staging copies are deleted this long after they stop being needed (readers mid-GET).
    staging_grace: float = 60.0

    def __post_init__(self) -> None:
        if self.staging not in ("bucket", "local-disk"):
            raise ConfigError('write.staging must be "bucket" or "local-disk"')
        if self.staging == "local-disk" and not self.staging_dir:
            raise ConfigError('write.staging = "local-disk" needs write.staging_dir')
        if self.catalog and not self.catalog.startswith(
            ("sqlite://", "postgresql://", "postgres://")
        ):
            raise ConfigError("write.catalog must be a sqlite:// or postgresql:// URL")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything `lota serve` needs. Build it with :func:`load`."""

    listen: str = "127.0.0.1:9000"
    region: str = "us-east"
    domain: str = "lota.local"
    cache: CacheConfig = field(default_factory=CacheConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    # This node's name in the catalog (leases, local-disk staging); defaults to the hostname.
    node: str = ""
    regions: Mapping[str, RegionConfig] = field(default_factory=dict)
    default_region: str = ""
    bucket_regions: Mapping[str, str] = field(default_factory=dict)
    # Seconds SIGTERM waits for in-flight requests before cancelling them.
    drain_timeout: float = 30.0
    # Seconds a request body may go without a byte before the request fails (RequestTimeout).
    body_timeout: float = 60.0
    # Seconds a connection has to deliver a whole request head, from when it opened or, when
    # kept alive, from the first byte of its next request: 408 RequestTimeout, or just closed.
    header_timeout: float = 10.0
    # Seconds a kept-alive connection may sit idle between requests before it is closed.
    keepalive_timeout: float = 75.0
    # Client connections open at once; past it, the one idle longest is closed (0: the
    # descriptor limit less what LOTA needs for origin sockets, cache files, the catalog).
    max_connections: int = 0
    # Seconds from an origin request's last byte sent to its response head (revalidations,
    # misses, pass-through); then a revalidation falls back to STALE, a miss answers 503.
    # A response body streaming in has a longer wait between bytes (see regions.origin).
    origin_timeout: float = 10.0
    tls_cert: str = ""
    tls_key: str = ""
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        parse_listen(self.listen)
        for name in ("header_timeout", "keepalive_timeout", "origin_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be more than 0 seconds")
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("max_connections must be a whole number, 0 for automatic")
        if not self.node:
            object.__setattr__(self, "node", socket.gethostname())
        if not self.default_region:
            object.__setattr__(self, "default_region", self.region)
        if not self.regions:
            raise ConfigError(
                "no origin configured: set [regions.NAME] endpoint, --origin URL, "
                "or --embedded-origin"
            )
        for bucket, home in self.bucket_regions.items():
            if not is_valid_bucket_name(bucket):
                raise ConfigError(f"[buckets]: {bucket!r} is not a valid bucket name")
            if home not in self.regions:
                raise ConfigError(f"[buckets]: {bucket} is homed in unknown region {home!r}")
        if self.default_region not in self.regions:
            raise ConfigError(
                f"buckets.default_region {self.default_region!r} is not a configured region"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together")
        if self.write.catalog and self.write.staging == "bucket":
            local = self.regions.get(self.region)
            if local is None or not local.staging_bucket:
                raise ConfigError(
                    f"write acceleration needs regions.{self.region}.staging_bucket "
                    '(or write.staging = "local-disk")'
                )

    def accelerated(self, bucket: str) -> bool:
        """Whether writes to `bucket` take the write-acceleration path on this node."""
        return bool(self.write.catalog) and self.home_region(bucket).name != self.region

    def home_region(self, bucket: str) -> RegionConfig:
        """The region whose origin holds `bucket`."""
        return self.regions[self.bucket_regions.get(bucket, self.default_region)]

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


# Environment variables and the settings they set, as (section, key). Flags use the same keys.
ENVIRONMENT = {
    "LOTA_LISTEN": ("", "listen"),
    "LOTA_REGION": ("", "region"),
    "LOTA_DOMAIN": ("", "domain"),
    "LOTA_ORIGIN": ("", "origin"),
    "LOTA_CACHE_DIRS": ("cache", "dirs"),
    "LOTA_CACHE_SIZE": ("cache", "size"),
    "LOTA_CACHE_CHUNK_SIZE": ("cache", "chunk_size"),
    "LOTA_AUTH_MODE": ("auth", "mode"),
    "LOTA_AUTH_CREDENTIALS": ("auth", "credentials"),
    "LOTA_DRAIN_TIMEOUT": ("", "drain_timeout"),
    "LOTA_BODY_TIMEOUT": ("", "body_timeout"),
    "LOTA_LOG_LEVEL": ("", "log_level"),
    "LOTA_NODE": ("", "node"),
    "LOTA_CATALOG": ("write", "catalog"),
}


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the config from a TOML file, then ``LOTA_*`` variables, then `overrides`.

    `overrides` uses the flat names of :data:`ENVIRONMENT` values (``"listen"``,
    ``"cache.dirs"``, ``"auth.mode"``, ``"origin"``...); ``None`` values are ignored.
    """
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    env = os.environ if environ is None else environ
    for name, (section, key) in ENVIRONMENT.items():
        if env.get(name):
            value: Any = env[name]
            if key == "dirs":
                value = [d for d in value.split(",") if d]
            _set(raw, section, key, value)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, _, key = dotted.rpartition(".")
            _set(raw, section, key, value)
    return _build(raw, env)


def _set(raw: dict[str, Any], section: str, key: str, value: Any) -> None:
    (raw.setdefault(section, {}) if section else raw)[key] = value


def _build(raw: dict[str, Any], env: Mapping[str, str]) -> Config:
    raw = dict(raw)
    try:
        cache = _cache(raw.pop("cache", {}))
        write = _write(raw.pop("write", {}))
        lifecycle = lifecycle_from_toml(raw.pop("lifecycle", {}))
        auth = _auth(raw.pop("auth", {}))
        region = str(raw.pop("region", "us-east"))
        regions = {
            name: RegionConfig(name=name, **_known(section, RegionConfig, f"regions.{name}"))
            for name, section in raw.pop("regions", {}).items()
        }
        origin = raw.pop("origin", None)
        if origin:
            regions[region] = RegionConfig(
                name=region,
                endpoint=str(origin),
                access_key_id=env.get("AWS_ACCESS_KEY_ID", ""),
                secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
                signing_region=env.get("AWS_DEFAULT_REGION", "")
                or env.get("AWS_REGION", "")
                or "us-east-1",
            )
        for r in list(regions.values()):
            if not r.access_key_id and env.get("AWS_ACCESS_KEY_ID"):
                regions[r.name] = replace(
                    r,
                    access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
                )
        buckets = dict(raw.pop("buckets", {}))
        default_region = str(buckets.pop("default_region", region))
        for key in (
            "drain_timeout",
            "body_timeout",
            "header_timeout",
            "keepalive_timeout",
            "origin_timeout",
        ):
            if key in raw:
                raw[key] = parse_duration(raw[key])
        return Config(
            region=region,
            write=write,
            lifecycle=lifecycle,
            cache=cache,
            auth=auth,
            regions=regions,
            default_region=default_region,
            bucket_regions={str(k): str(v) for k, v in buckets.items()},
            **_known(raw, Config, "top level"),
        )
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


def _cache(section: Mapping[str, Any]) -> CacheConfig:
    values = dict(_known(section, CacheConfig, "cache"))
    if "dirs" in values:
        dirs = values["dirs"]
        values["dirs"] = (dirs,) if isinstance(dirs, str) else tuple(str(d) for d in dirs)
    for key in ("size", "chunk_size"):
        if key in values:
            values[key] = parse_size(values[key])
    for key in ("revalidate_after", "stale_if_error", "scrub_interval"):
        if key in values:
            values[key] = parse_duration(values[key])
    for key in ("immutable", "pinned"):
        if key in values:
            values[key] = tuple(str(p).lstrip("/") for p in values[key])
    if "revalidate" in values:
        values["revalidate"] = tuple(
            (str(prefix).lstrip("/"), parse_duration(after))
            for prefix, after in dict(values["revalidate"]).items()
        )
    return CacheConfig(**values)


def _write(section: Mapping[str, Any]) -> WriteConfig:
    values = dict(_known(section, WriteConfig, "write"))
    for key in ("lease", "staging_grace"):
        if key in values:
            values[key] = parse_duration(values[key])
    if "migrate_bandwidth" in values:
        values["migrate_bandwidth"] = parse_size(values["migrate_bandwidth"])
    return WriteConfig(**values)


def _auth(section: Mapping[str, Any]) -> AuthConfig:
    values = dict(_known(section, AuthConfig, "auth"))
    if "max_skew" in values:
        values["max_skew"] = parse_duration(values["max_skew"])
    return AuthConfig(**values)


def _known(section: Mapping[str, Any], cls: type, where: str) -> dict[str, Any]:
    """Reject settings LOTA does not know, so a typo is an error rather than silently ignored."""
    allowed = set(cls.__dataclass_fields__) - {"name"}  # type: ignore[attr-defined]
    unknown = set(section) - allowed
    if unknown:
        raise ConfigError(f"unknown setting(s) in {where}: {', '.join(sorted(unknown))}")
    return dict(section)
