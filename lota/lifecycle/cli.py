"""``lota lifecycle plan`` and ``lota lifecycle run``: the engine once, from the command line.

::

    lota lifecycle plan --config F [--bucket B] [--now 2027-03-01T00:00:00Z] [--json]
    lota lifecycle run  --config F [--now 2027-03-01T00:00:00Z]

``plan`` prints one line per object that would move: bucket, key, from tier, to tier and
the reason, tab-separated (``--json``: one JSON object per line); it changes nothing.
``run`` applies the same plan once (taking the lifecycle lease, like a server would),
prints a summary and exits: 0 when everything due moved, 1 when some transitions failed
or another node held or took the lease.

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

import aiohttp

from lota import config as configuration
from lota.catalog import open_catalog
from lota.clock import Clock
from lota.config import Config
from lota.errors import ConfigError
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.engine import Engine
from lota.lifecycle.origin import OriginListing, OriginMover
from lota.metrics import Metrics
from lota.regions.origins import Origins


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
    if not lifecycle.rules:
        print("lota lifecycle: no [[lifecycle.rules]] in the config", file=sys.stderr)
    clock = Clock.from_environment()
    catalog = await open_catalog(config.catalog.url, clock=clock, node=config.node)
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
            auto_decompress=False,
        ) as session:
            origins = Origins(config, session, Metrics())
            yield (
                Engine(
                    catalog,
                    OriginListing(origins.for_bucket),
                    OriginMover(origins.for_bucket),
                    lifecycle,
                    clock=clock,
                ),
                clock,
            )
    finally:
        await catalog.close()
