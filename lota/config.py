"""LOTA's configuration: frozen, typed, validated once, loaded from TOML + environment + flags.

Precedence, lowest first: built-in defaults, the TOML file (``--config``), ``LOTA_*``
environment variables, command-line flags. Nothing else reads configuration; the rest of
the code receives a :class:`Config` (or the part of it it needs).

Every setting also has a variable, by one rule: ``LOTA_`` + its TOML path in capitals with
``.`` and ``-`` as ``_`` (``cache.readahead`` -> ``LOTA_CACHE_READAHEAD``,
``regions.eu-west.endpoint`` -> ``LOTA_REGIONS_EU_WEST_ENDPOINT``). Lists are
comma-separated, tables ``KEY=VALUE`` pairs, ``lifecycle.rules`` JSON. A ``LOTA_*``
variable that is not a setting (nor one of :data:`NOT_SETTINGS`) is an error.

Values are parsed by kind (:mod:`lota.settings`): sizes accept ``"10GiB"``, ``"512MB"`` or
a byte count; durations ``"30s"``, ``"5m"``, ``"1h"``, ``"60d"`` or seconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import socket
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from lota.cluster.config import ClusterConfig
from lota.errors import ConfigError
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.config import from_toml as lifecycle_from_toml
from lota.lifecycle.rules import TIERS
from lota.s3.addressing import is_valid_bucket_name
from lota.settings import (
    Duration,
    Size,
    coerce,
    parse_duration,
    parse_size,
    section_values,
    split_table,
)

__all__ = ["Config", "load", "parse_duration", "parse_size"]


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
    size: Size = 10 * 1024**3
    chunk_size: Size = 8 * 1024**2
    # Check each chunk's xxh3 digest on every read, on the first read after a restart, or never.
    verify: Literal["always", "after-restart", "never"] = "after-restart"
    # Seconds after which a cached object is checked against the origin before use...
    revalidate_after: Duration = 30.0
    # ...with per-prefix overrides ("bucket/prefix", seconds), first match wins...
    revalidate: tuple[tuple[str, float], ...] = ()
    # ...and prefixes ("bucket/prefix") whose objects never change (checkpoints): never checked.
    immutable: tuple[str, ...] = ()
    # Prefixes ("bucket/prefix") never evicted.
    pinned: tuple[str, ...] = ()
    # How long past revalidate_after a copy may be served STALE while the origin is unreachable.
    stale_if_error: Duration = 3600.0
    # Chunks fetched ahead of a sequential range reader.
    readahead: int = 4
    # Chunks of one read fetched at once, each with its own ranged origin GET, ahead of the
    # reader (a cold read of a large object, a warm, a bytes=0-0 prestage).
    fill_concurrency: int = 8
    # Seconds between background digest checks of idle chunks (0: off).
    scrub_interval: Duration = 3600.0
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
        for path in self.dirs:
            if ":" in path:
                raise ConfigError(
                    f"cache.dirs: {path!r} has a ':'; list several directories as a TOML list "
                    "or comma-separated (LOTA_CACHE_DIRS=/nvme0/lota,/nvme1/lota)"
                )
        if self.readahead < 0:
            raise ConfigError("cache.readahead must not be negative")
        if self.fill_concurrency < 1:
            raise ConfigError("cache.fill_concurrency must be at least 1")
        if not 0 < self.low_watermark < self.high_watermark <= 1:
            raise ConfigError("cache watermarks need 0 < low_watermark < high_watermark <= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """How clients prove who they are: SigV4 against a credentials file, or nothing at all."""

    mode: Literal["sigv4", "none"] = "sigv4"
    credentials: str = ""
    # The largest difference between a request's x-amz-date and our clock (S3 allows 15 min).
    max_skew: Duration = 900.0

    def __post_init__(self) -> None:
        if self.mode not in ("sigv4", "none"):
            raise ConfigError(f'auth.mode must be "sigv4" or "none", got {self.mode!r}')


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogConfig:
    """The shared catalog: pending cross-region writes, last accesses and tiers, leases,
    invalidation events. Write acceleration, the lifecycle and cross-node invalidation
    need it; without one, writes to far buckets go straight to their home origin."""

    # "sqlite:////abs/path.db" (embedded; one machine) or "postgresql://..." (a cluster).
    url: str = ""

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ConfigError("catalog.url must be a sqlite:// or postgresql:// URL")


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteConfig:
    """Cross-region write acceleration (with a catalog): staging, and the migrator."""

    # "bucket": the local region's staging_bucket (durable, readable from every node);
    # "local-disk": `staging_dir` on this node (single-node use: lost with the disk).
    staging: Literal["bucket", "local-disk"] = "bucket"
    staging_dir: str = ""
    # Objects migrated at once, parts of one object at once, and their bandwidth cap
    # (bytes/s over all migrations; 0: none).
    migrate_concurrency: int = 4
    part_concurrency: int = 4
    migrate_bandwidth: Size = 0
    # A migration lease lasts this long unless renewed; a dead node's work moves on after it.
    lease: Duration = 60.0
    # Staging copies are deleted this long after they stop being needed (readers mid-GET);
    # staged objects no catalog entry names (orphans) this long after they were written.
    staging_grace: Duration = 60.0
    # Create this region's staging bucket at start if it does not exist.
    create_staging: bool = False

    def __post_init__(self) -> None:
        if self.staging not in ("bucket", "local-disk"):
            raise ConfigError('write.staging must be "bucket" or "local-disk"')
        if self.staging == "local-disk" and not self.staging_dir:
            raise ConfigError('write.staging = "local-disk" needs write.staging_dir')


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything `lota serve` needs. Build it with :func:`load`."""

    listen: str = "127.0.0.1:9000"
    region: str = "us-east"
    domain: str = "lota.local"
    cache: CacheConfig = field(default_factory=CacheConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # This node's name in the catalog (leases, local-disk staging); defaults to the hostname.
    node: str = ""
    # Worker processes serving the listen address over one cache (0: one per CPU this
    # process may use; 1: this process serves alone).
    workers: int = 0
    # Linux scheduling policy of the serving processes: "batch" (SCHED_BATCH: a worker a
    # request wakes takes its turn on a busy core instead of preempting the task running
    # there) or "normal" (the policy it was started with). See lota.node.serve.schedule.
    scheduling: Literal["batch", "normal"] = "batch"
    regions: Mapping[str, RegionConfig] = field(default_factory=dict)
    default_region: str = ""
    bucket_regions: Mapping[str, str] = field(default_factory=dict)
    # Seconds SIGTERM waits for in-flight requests before cancelling them.
    drain_timeout: Duration = 30.0
    # Seconds a request body may go without a byte before the request fails (RequestTimeout).
    body_timeout: Duration = 60.0
    # Seconds a connection has to deliver a whole request head, from when it opened or, when
    # kept alive, from the first byte of its next request: 408 RequestTimeout, or just closed.
    header_timeout: Duration = 10.0
    # Seconds a kept-alive connection may sit idle between requests before it is closed.
    keepalive_timeout: Duration = 75.0
    # Client connections open at once; past it, the one idle longest is closed (0: the
    # descriptor limit less what LOTA needs for origin sockets, cache files, the catalog).
    max_connections: int = 0
    # Seconds from an origin request's last byte sent to its response head (revalidations,
    # misses, pass-through); then a revalidation falls back to STALE, a miss answers 503.
    # A response body streaming in has a longer wait between bytes (see regions.origin).
    origin_timeout: Duration = 10.0
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
        if not 0 <= self.workers <= 256:
            raise ConfigError("workers must be from 0 (one per CPU) to 256")
        if self.scheduling not in ("batch", "normal"):
            raise ConfigError('scheduling must be "batch" or "normal"')
        if not self.node:
            object.__setattr__(self, "node", socket.gethostname())
        if not self.default_region:
            object.__setattr__(self, "default_region", self.region)
        for bucket, home in self.bucket_regions.items():
            if not is_valid_bucket_name(bucket):
                raise ConfigError(f"[buckets]: {bucket!r} is not a valid bucket name")
            if home not in self.regions:
                raise ConfigError(f"[buckets]: {bucket} is homed in unknown region {home!r}")
        if self.regions and self.default_region not in self.regions:
            raise ConfigError(
                f"buckets.default_region {self.default_region!r} is not a configured region"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together")
        if self.cluster.on and not self.cluster.self:
            host, _ = self.listen_address
            if host in ("0.0.0.0", "::", ""):
                raise ConfigError(
                    f"listen = {self.listen!r} does not say how peers reach this node: set "
                    "cluster.self (LOTA_CLUSTER_SELF) to HOST:PORT"
                )
            object.__setattr__(self, "cluster", replace(self.cluster, self=self.listen))

    def require_origin(self) -> None:
        """ConfigError unless an origin is configured (serving, the lifecycle)."""
        if not self.regions:
            raise ConfigError(
                "no origin configured: set [regions.NAME] endpoint (LOTA_REGIONS_NAME_ENDPOINT), "
                "--origin URL (LOTA_ORIGIN), or --embedded-origin"
            )

    def require_serving(self) -> None:
        """ConfigError unless `lota serve` has all it needs. Kept out of validation so that
        commands which only read the catalog (``lota migrations``) work without them."""
        self.require_origin()
        if self.cluster.on and not self.cache.dirs:
            raise ConfigError(
                "a node of a cluster needs a cache (cache.dirs): it owns a share of the chunks"
            )
        if self.auth.mode == "sigv4" and not self.auth.credentials:
            raise ConfigError(
                'auth.mode = "sigv4" (the default) needs auth.credentials, a credentials file '
                '(make one with `lota credentials new FILE`), or auth.mode = "none" on a '
                "trusted network"
            )
        if self.accelerates_writes and self.write.staging == "bucket":
            local = self.regions.get(self.region)
            if local is None or not local.staging_bucket:
                raise ConfigError(
                    f"write acceleration needs regions.{self.region}.staging_bucket "
                    '(or write.staging = "local-disk")'
                )

    @property
    def accelerates_writes(self) -> bool:
        """Whether write acceleration is on: a catalog, and a bucket homed in another
        region (every bucket not listed is homed in ``buckets.default_region``)."""
        homes = {self.default_region, *self.bucket_regions.values()}
        return bool(self.catalog.url) and bool(homes - {self.region})

    def accelerated(self, bucket: str) -> bool:
        """Whether writes to `bucket` take the write-acceleration path on this node."""
        return bool(self.catalog.url) and self.home_region(bucket).name != self.region

    def home_region(self, bucket: str) -> RegionConfig:
        """The region whose origin holds `bucket`."""
        return self.regions[self.bucket_regions.get(bucket, self.default_region)]

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def worker_count(self) -> int:
        """How many worker processes serve: ``workers``, or one per CPU this process may
        use (its affinity, as a container's CPU set gives it)."""
        return self.workers or len(os.sched_getaffinity(0))


# ``LOTA_*`` variables that are not settings: which file, which node a client command talks
# to, the test clock (lota.clock), and what a worker process is told by its supervisor.
NOT_SETTINGS = frozenset({"LOTA_CONFIG", "LOTA_ENDPOINT", "LOTA_TIME_OFFSET", "LOTA_WORKER"})
# Variables that were renamed: when every setting got its variable by one rule, and when
# the catalog got its own section.
RENAMED = {"LOTA_CATALOG": "LOTA_CATALOG_URL", "LOTA_WRITE_CATALOG": "LOTA_CATALOG_URL"}
# Settings of the file that were renamed: old path -> how the error names the new one.
RENAMED_SETTINGS = {"write.catalog": "[catalog] url (LOTA_CATALOG_URL)"}
_SECTIONS: dict[str, type] = {
    "cache": CacheConfig,
    "auth": AuthConfig,
    "catalog": CatalogConfig,
    "write": WriteConfig,
    "lifecycle": LifecycleConfig,
    "cluster": ClusterConfig,
}
# Fields of Config that are set by a table rather than by a key of their own.
_TABLES = frozenset({*_SECTIONS, "regions", "default_region", "bucket_regions"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting the config accepts: its TOML path (``NAME``/``BUCKET`` stand for a name
    of the user's) and its kind (see :mod:`lota.settings`; ``table`` and ``json`` too)."""

    path: str
    kind: str

    @property
    def variable(self) -> str:
        """The rule: ``LOTA_`` + the path in capitals, ``.`` and ``-`` as ``_``."""
        return "LOTA_" + re.sub(r"[.-]", "_", self.path).upper()


def settings() -> Iterator[Setting]:
    """Every setting, in the order of the README's configuration reference."""
    for f in dataclasses.fields(Config):
        if f.name not in _TABLES:
            yield Setting(f.name, str(f.type))
    yield Setting("origin", "str")
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            if (section, f.name) in (("cache", "revalidate"), ("cluster", "dial")):
                yield Setting(f"{section}.{f.name}", "table")
            elif (section, f.name) == ("lifecycle", "tiers"):
                yield from (Setting(f"lifecycle.tiers.{tier}", "str") for tier in TIERS)
            elif (section, f.name) == ("lifecycle", "rules"):
                yield Setting("lifecycle.rules", "json")
            else:
                yield Setting(f"{section}.{f.name}", str(f.type))
    for f in dataclasses.fields(RegionConfig):
        if f.name != "name":
            yield Setting(f"regions.NAME.{f.name}", str(f.type))
    yield Setting("buckets.default_region", "str")
    yield Setting("buckets", "table")


def load(
    path: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the config from a TOML file, then ``LOTA_*`` variables, then `overrides`.

    `overrides` uses the dotted paths of :func:`settings` (``"listen"``, ``"cache.dirs"``,
    ``"auth.mode"``, ``"origin"``...); ``None`` values are ignored.
    """
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    env = os.environ if environ is None else environ
    _apply_environment(raw, env)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _place(raw, dotted, value)
    return _build(raw, env)


def _apply_environment(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    """Each ``LOTA_*`` variable onto the TOML it overrides; an unknown one is an error, so
    that a misspelt variable is not silently ignored. Empty variables count as unset."""
    known = {s.variable: s for s in settings() if "NAME" not in s.path}
    for name, value in sorted(env.items()):
        if not name.startswith("LOTA_") or name in NOT_SETTINGS or not value:
            continue
        setting = known.get(name) or _region_setting(name, raw.get("regions", {}))
        if setting is None:
            raise ConfigError(_unknown_variable(name, known))
        _place(raw, setting.path, _from_variable(setting, name, value))


def _region_setting(name: str, regions: Any) -> Setting | None:
    """``LOTA_REGIONS_EU_WEST_ENDPOINT`` -> regions.eu-west.endpoint: the region named so
    in the file, else the name in lower case with ``-`` for ``_``."""
    prefix = "LOTA_REGIONS_"
    if not name.startswith(prefix):
        return None
    for f in dataclasses.fields(RegionConfig):
        suffix = "_" + f.name.upper()
        region = name[len(prefix) : -len(suffix)]
        if f.name != "name" and name.endswith(suffix) and region:
            written = {str(r).upper().replace("-", "_"): str(r) for r in regions}
            region = written.get(region, region.lower().replace("_", "-"))
            return Setting(f"regions.{region}.{f.name}", str(f.type))
    return None


def _from_variable(setting: Setting, name: str, value: str) -> Any:
    if setting.kind == "table":
        return split_table(value, name)
    if setting.kind == "json":
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"{name} must be JSON: {exc}") from None
    return coerce(value, setting.kind, name)


def _unknown_variable(name: str, known: Mapping[str, Setting]) -> str:
    hint = RENAMED.get(name) or next(iter(difflib.get_close_matches(name, known, 1)), None)
    return (
        f"unknown variable {name}: settings come from LOTA_<SECTION>_<KEY> "
        "(see the configuration reference in the README)"
        + (f"; did you mean {hint}?" if hint else "")
    )


def _place(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set the TOML value at `dotted`; a table's entries join those already there."""
    *sections, key = dotted.split(".")
    table = raw
    for section in sections:
        table = table.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{section} must be a table")
    if isinstance(value, dict) and isinstance(table.get(key), dict):
        table[key] = {**table[key], **value}
    else:
        table[key] = value


def _refuse_renamed(raw: Mapping[str, Any]) -> None:
    """A setting written under its old name is an error naming the new one, rather than
    silently doing nothing (or an "unknown setting" that does not say where it went)."""
    for old, new in RENAMED_SETTINGS.items():
        section, key = old.split(".")
        table = raw.get(section)
        if isinstance(table, Mapping) and key in table:
            raise ConfigError(f"{old} has moved: set {new}")


def _build(raw: dict[str, Any], env: Mapping[str, str]) -> Config:
    raw = dict(raw)
    _refuse_renamed(raw)
    try:
        cache = _cache(raw.pop("cache", {}))
        catalog = CatalogConfig(**section_values(raw.pop("catalog", {}), CatalogConfig, "catalog."))
        write = WriteConfig(**section_values(raw.pop("write", {}), WriteConfig, "write."))
        lifecycle = lifecycle_from_toml(raw.pop("lifecycle", {}))
        cluster = _cluster(raw.pop("cluster", {}))
        auth = AuthConfig(**section_values(raw.pop("auth", {}), AuthConfig, "auth."))
        regions = _regions(raw.pop("regions", {}))
        origin = raw.pop("origin", None)
        buckets = raw.pop("buckets", {})
        if not isinstance(buckets, Mapping):
            raise ConfigError('buckets must be a table: BUCKET = "REGION"')
        buckets = dict(buckets)
        top = section_values(raw, Config, "", special=_TABLES)
        region = top.pop("region", "us-east")
        if origin:
            regions[region] = _single_origin(region, coerce(origin, "str", "origin"), env)
        for r in list(regions.values()):
            if not r.access_key_id and env.get("AWS_ACCESS_KEY_ID"):
                regions[r.name] = replace(
                    r,
                    access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
                )
        default_region = coerce(
            buckets.pop("default_region", region), "str", "buckets.default_region"
        )
        return Config(
            region=region,
            catalog=catalog,
            write=write,
            lifecycle=lifecycle,
            cluster=cluster,
            cache=cache,
            auth=auth,
            regions=regions,
            default_region=default_region,
            bucket_regions={str(k): coerce(v, "str", f"buckets.{k}") for k, v in buckets.items()},
            **top,
        )
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


def _single_origin(region: str, endpoint: str, env: Mapping[str, str]) -> RegionConfig:
    """``origin = URL``: one region, with the origin's credentials from ``AWS_*``."""
    return RegionConfig(
        name=region,
        endpoint=endpoint,
        access_key_id=env.get("AWS_ACCESS_KEY_ID", ""),
        secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", ""),
        signing_region=env.get("AWS_DEFAULT_REGION", "")
        or env.get("AWS_REGION", "")
        or "us-east-1",
    )


def _regions(data: Any) -> dict[str, RegionConfig]:
    if not isinstance(data, Mapping):
        raise ConfigError("regions must be tables: [regions.NAME]")
    return {
        str(name): RegionConfig(
            name=str(name), **section_values(section, RegionConfig, f"regions.{name}.")
        )
        for name, section in data.items()
    }


def _cluster(section: Any) -> ClusterConfig:
    """``[cluster]``; the secret is read from ``secret_file`` here, once."""
    values = section_values(section, ClusterConfig, "cluster.", special={"dial"})
    dial = values.get("dial", {})
    if not isinstance(dial, Mapping):
        raise ConfigError('cluster.dial must be a table: "MEMBER" = "HOST:PORT"')
    values["dial"] = tuple((str(k), coerce(v, "str", f"cluster.dial.{k}")) for k, v in dial.items())
    path = values.get("secret_file", "")
    if path and not values.get("secret"):
        try:
            values["secret"] = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cluster.secret_file: cannot read {path}: {exc}") from None
    return ClusterConfig(**values)


def _cache(section: Any) -> CacheConfig:
    values = section_values(section, CacheConfig, "cache.", special={"revalidate"})
    for key in ("immutable", "pinned"):
        if key in values:
            values[key] = tuple(p.lstrip("/") for p in values[key])
    if "revalidate" in values:
        table = values["revalidate"]
        if not isinstance(table, Mapping):
            raise ConfigError('cache.revalidate must be a table: "bucket/prefix" = "5m"')
        values["revalidate"] = tuple(
            (str(prefix).lstrip("/"), coerce(after, "Duration", f"cache.revalidate.{prefix}"))
            for prefix, after in table.items()
        )
    return CacheConfig(**values)
