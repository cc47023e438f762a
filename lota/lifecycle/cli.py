"""``lota lifecycle plan``, ``run`` and ``status``: the engine once, from the command line.

::

    lota lifecycle plan   --config F [--bucket B] [--now 2027-03-01T00:00:00Z] [--json]
    lota lifecycle run    --config F [--now 2027-03-01T00:00:00Z]
    lota lifecycle status --config F s3://bucket/key [--now ...] [--json]

``plan`` prints one line per object that would move: bucket, key, from tier, to tier and
the reason, tab-separated (``--json``: one JSON object per line); it changes nothing.
``run`` applies the same plan once (taking the lifecycle lease, like a server would),
prints a summary and exits: 0 when everything due moved, 1 when some transitions failed
or another node held or took the lease. ``status`` prints one object's tier, its last
access, the rule that governs it and when that rule would move it where (or why never);
exit status 1 if the object does not exist.

The rules are the catalog's (``PUT /_lota/lifecycle/rules``) once they were replaced
there, else the config's.

Decisions are made at ``--now`` if given, else at the process clock's now
(``LOTA_TIME_OFFSET`` shifts it). ``--now`` only moves the decisions: leases and the
signatures of origin requests keep the process clock, so a plan for next year does not
take the lease for a year.

The lifecycle needs the catalog (access times and tiers live there): the config must set
``[catalog] url`` (no staging bucket: that is for write acceleration). Configuration
problems raise :class:`lota.errors.ConfigError`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TextIO

from lota import config as configuration
from lota.catalog import open_catalog
from lota.clock import Clock
from lota.config import Config
from lota.errors import ConfigError
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.engine import Engine
from lota.lifecycle.origin import OriginListing, OriginMover, OriginTags
from lota.lifecycle.rules import ObjectInfo, Status
from lota.lifecycle.state import LifecycleState
from lota.metrics import Metrics
from lota.regions.control import ControlPlane


async def plan_command(
    config_path: str | None, bucket: str | None, now: str | None, as_json: bool, out: TextIO
) -> int:
    """Print the transitions due at `now` (ISO 8601) without making any."""
    moves = 0
    async with open_engine(config_path) as (engine, clock):
        async for decision in engine.plan(parse_now(now, clock), bucket):
            out.write((json.dumps(decision.as_dict()) if as_json else decision.line()) + "\n")
            moves += 1
    if not moves and not as_json:  # JSON lines stay a (then empty) stream of decisions
        out.write(
            "lota lifecycle: nothing would move"
            + (f" in {bucket}" if bucket else "")
            + " (no object is due for a transition; objects under a rule's min_size never move)\n"
        )
    out.flush()
    return 0


async def status_command(
    config_path: str | None, url: str, now: str | None, as_json: bool, out: TextIO
) -> int:
    """Print what the rules say about the object at `url` (``s3://bucket/key``)."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if not url.startswith("s3://") or not bucket or not key:
        raise ConfigError(f"expected s3://bucket/key, got {url!r}")
    async with open_engine(config_path) as (engine, clock):
        found = await engine.status(bucket, key, parse_now(now, clock))
    if found is None:
        print(f"lota lifecycle: {url} does not exist", file=sys.stderr)
        return 1
    obj, status = found
    if as_json:
        out.write(json.dumps({"bucket": bucket, "key": key, **_status_fields(obj, status)}) + "\n")
    else:
        out.write(_status_lines(url, obj, status))
    return 0


def _status_fields(obj: ObjectInfo, status: Status) -> dict[str, object]:
    return {
        "size": obj.size,
        "storage_class": obj.storage_class,
        "tier": status.tier,
        "last_access": _iso(status.last_access),
        "rule": status.rule or None,
        "next_tier": status.next_tier or None,
        "due_at": _iso(status.due_at) if status.due_at is not None else None,
        "note": status.note or None,
    }


def _status_lines(url: str, obj: ObjectInfo, status: Status) -> str:
    lines = [
        url,
        f"  tier:         {status.tier or '(none)'} ({obj.storage_class}), {obj.size} bytes",
        f"  last access:  {_iso(status.last_access)}",
        f"  rule:         {status.rule or '(none)'}",
    ]
    if status.next_tier and status.due_at is not None:
        lines.append(f"  moves to:     {status.next_tier} at {_iso(status.due_at)}")
    if status.note:
        lines.append(f"  note:         {status.note}")
    return "\n".join(lines) + "\n"


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def run_command(config_path: str | None, now: str | None) -> int:
    """Apply the transitions due at `now` (ISO 8601) once."""
    async with open_engine(config_path) as (engine, clock):
        report = await engine.run(parse_now(now, clock))
    if report is None:
        print("lota lifecycle: another node holds the lifecycle lease; nothing done")
        return 1
    print(
        f"lifecycle: {report.scanned} objects scanned, {report.moved} moved "
        f"({report.moved_bytes} bytes), {report.skipped} skipped, {report.failed} failed"
        + (", stopped: lease lost" if report.lease_lost else "")
    )
    return 1 if report.failed or report.lease_lost else 0


def parse_now(text: str | None, clock: Clock) -> float:
    """``--now`` (``2027-03-01T00:00:00Z``; no zone means UTC), else the clock's now."""
    if not text:
        return clock.time()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"--now: {text!r} is not an ISO 8601 time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def load_config(path: str | None) -> tuple[Config, LifecycleConfig]:
    """The config and its ``[lifecycle]`` section."""
    config = configuration.load(path or os.environ.get("LOTA_CONFIG"))
    return config, config.lifecycle


@asynccontextmanager
async def open_engine(config_path: str | None) -> AsyncIterator[tuple[Engine, Clock]]:
    """An engine as the config describes it (its own catalog and origin clients), with the
    process clock; closed on exit."""
    config, lifecycle = load_config(config_path)
    config.require_origin()
    if not config.catalog.url:
        raise ConfigError(
            "the lifecycle needs the catalog (last accesses and tiers live there): "
            "set [catalog] url (LOTA_CATALOG_URL)"
        )
    clock = Clock.from_environment()
    catalog = await open_catalog(config.catalog.url, clock=clock, node=config.node)
    try:
        state = LifecycleState(lifecycle.rules, catalog)
        await state.load()
        if not state.rules:
            print("lota lifecycle: no rules (config or catalog)", file=sys.stderr)
        control = ControlPlane(config, Metrics())
        try:
            yield (
                Engine(
                    catalog,
                    OriginListing(control),
                    OriginMover(control),
                    lifecycle,
                    clock=clock,
                    state=state,
                    tags=OriginTags(control),
                ),
                clock,
            )
        finally:
            await control.close()
    finally:
        await catalog.close()
