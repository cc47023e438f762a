"""The lota command: serve the S3 endpoint, warm a node's cache, make client credentials,
and inspect cross-region migrations and access-based tiering.

Settings come from a TOML file (--config or LOTA_CONFIG), then LOTA_* variables
(LOTA_<SECTION>_<KEY>, e.g. LOTA_CACHE_SIZE=10GiB), then flags.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from lota import __version__, logs
from lota import config as configuration
from lota.config import Config
from lota.errors import ConfigError, LotaError, StartupError

log = logging.getLogger("lota.cli")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    logs.setup(os.environ.get("LOTA_LOG_LEVEL", "INFO"))
    try:
        return int(args.command(args))
    except ConfigError as exc:
        print(f"lota: configuration error: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"lota: {exc}", file=sys.stderr)
        return 2
    except LotaError as exc:  # the origin or the catalog failed a command midway
        print(f"lota: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lota", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"lota {__version__}")
    commands = parser.add_subparsers(title="commands")
    serve = commands.add_parser("serve", help="run the S3 endpoint")
    serve.set_defaults(command=_serve)
    serve.add_argument("--config", help="TOML config file (also LOTA_CONFIG)")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9000)")
    serve.add_argument("--region", help="this node's region")
    serve.add_argument("--domain", help="virtual-hosted style domain: BUCKET.DOMAIN")
    serve.add_argument("--origin", help="single-origin shortcut: the S3 endpoint URL")
    serve.add_argument("--cache-dir", action="append", help="cache directory (repeatable)")
    serve.add_argument("--cache-size", help="cache byte budget, e.g. 10GiB")
    serve.add_argument("--auth", choices=["sigv4", "none"], help="client authentication")
    serve.add_argument("--credentials", help="credentials file (TOML) for sigv4")
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key", help="the certificate's private key (PEM)")
    serve.add_argument(
        "--embedded-origin",
        action="store_true",
        help="start a local S3 server (moto) as the origin, for trying LOTA out",
    )
    serve.add_argument("--origin-latency", default="0", help="embedded origin: one-way latency")
    serve.add_argument("--origin-bandwidth", default="", help="embedded origin: cap, e.g. 1Gbit")

    warm = commands.add_parser("warm", help="fill a node's cache with every object under a prefix")
    warm.set_defaults(command=_warm)
    warm.add_argument("url", help="s3://bucket/prefix")
    warm.add_argument(
        "--endpoint",
        default=os.environ.get("LOTA_ENDPOINT", "http://127.0.0.1:9000"),
        help="the LOTA node (default $LOTA_ENDPOINT or http://127.0.0.1:9000)",
    )
    warm.add_argument("--concurrency", type=int, default=8, help="objects filled at once")

    credentials = commands.add_parser("credentials", help="client credentials files")
    credential_steps = credentials.add_subparsers(title="steps")
    new = credential_steps.add_parser(
        "new", help="write a new credentials file: one principal allowed everything"
    )
    new.set_defaults(command=_credentials_new)
    new.add_argument("file", help="where to write it (never overwritten)")
    new.add_argument("--name", default="admin", help="the principal's name (default admin)")

    migrations = commands.add_parser(
        "migrations", help="accelerated writes not yet in their home region"
    )
    migrations.set_defaults(command=_migrations)
    migrations.add_argument("--config", help="TOML config file (also LOTA_CONFIG)")
    migrations.add_argument("--json", action="store_true", help="one JSON object")

    lifecycle = commands.add_parser(
        "lifecycle", help="access-based tiering: plan, run, or one object's status"
    )
    steps = lifecycle.add_subparsers(title="steps")
    plan = steps.add_parser("plan", help="print what would move between tiers, and why")
    plan.set_defaults(command=_lifecycle_plan)
    plan.add_argument("--bucket", help="only this bucket")
    plan.add_argument("--json", action="store_true", help="one JSON object per line")
    run = steps.add_parser("run", help="apply the transitions once and exit")
    run.set_defaults(command=_lifecycle_run)
    status = steps.add_parser(
        "status", help="an object's tier, last access, and which rule would move it when"
    )
    status.set_defaults(command=_lifecycle_status)
    status.add_argument("url", help="s3://bucket/key")
    status.add_argument("--json", action="store_true", help="one JSON object")
    for step in (plan, run, status):
        step.add_argument("--config", help="TOML config file (also LOTA_CONFIG)")
        step.add_argument(
            "--now", help="decide as of this time (ISO 8601); wins over LOTA_TIME_OFFSET"
        )
    return parser


def _serve(args: argparse.Namespace) -> int:
    from lota.node.serve import collect_less, schedule, serve
    from lota.workers.spec import WorkerSpec
    from lota.workers.supervisor import Supervisor

    overrides: dict[str, Any] = {
        "listen": args.listen,
        "region": args.region,
        "domain": args.domain,
        "origin": args.origin,
        "cache.dirs": args.cache_dir,
        "cache.size": args.cache_size,
        "auth.mode": args.auth,
        "auth.credentials": args.credentials,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }
    path = args.config or os.environ.get("LOTA_CONFIG")
    collect_less()
    spec = WorkerSpec.from_environment()
    if spec is not None:  # a worker its supervisor started: its settings come from it
        spec.stop_with_supervisor()
        config = spec.configure(configuration.load(spec.config_path, overrides=spec.overrides))
        schedule(config.scheduling)
        _run(serve(config, worker=spec))
        return 0

    async def run() -> None:
        async with AsyncExitStack() as stack:
            if args.embedded_origin:
                overrides.update(await _embedded_origin(stack, args, path, overrides))
            config = configuration.load(path, overrides=overrides)
            config.require_serving()
            announce = functools.partial(_announce, config=config, args=args)
            if config.worker_count > 1:
                given = {k: v for k, v in overrides.items() if v is not None}
                workers = Supervisor(config, config.worker_count, path, given)
                await workers.run(on_ready=announce)
            else:  # the origin above (moto) started first: it keeps the policy it had
                schedule(config.scheduling)
                await serve(config, on_ready=announce)

    _run(run())
    return 0


async def _embedded_origin(
    stack: AsyncExitStack, args: argparse.Namespace, path: str | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Start moto as the origin; with sigv4 and no credentials file, make one to print."""
    import importlib.util

    if importlib.util.find_spec("moto") is None:
        raise StartupError(
            "--embedded-origin needs moto, which is not installed: "
            "pip install 'lota[embedded]' (make serve does it), or give --origin URL"
        )
    from lota.embedded import EmbeddedOrigin
    from lota.errors import OriginStartError
    from lota.testing.wan import parse_bandwidth

    try:
        origin = await stack.enter_async_context(
            EmbeddedOrigin(
                latency=configuration.parse_duration(args.origin_latency),
                bandwidth=parse_bandwidth(args.origin_bandwidth) if args.origin_bandwidth else None,
            )
        )
    except OriginStartError as exc:
        raise StartupError(f"the embedded origin did not start: {exc}") from exc
    os.environ.setdefault("AWS_ACCESS_KEY_ID", origin.access_key_id)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", origin.secret_access_key)
    extra: dict[str, Any] = {"origin": origin.endpoint}
    config = configuration.load(path, overrides={**overrides, **extra})
    if config.auth.mode == "sigv4" and not config.auth.credentials:
        extra["auth.credentials"] = str(_demo_credentials(args.cache_dir))
    return extra


def _demo_credentials(cache_dirs: list[str] | None) -> Path:
    """A credentials file with one all-powerful principal, next to the cache (or in ./var)."""
    from lota.auth.credentials import write_new

    base = Path(cache_dirs[0]).parent if cache_dirs else Path("var")
    path = base / "demo-credentials.toml"
    if not path.exists():
        write_new(path, "demo")
    return path


def _announce(url: str, config: Config, args: argparse.Namespace) -> None:
    lines = [f"LOTA is serving S3 on {url}"]
    if args.embedded_origin:
        lines.append("The embedded origin keeps objects in memory: they are gone when LOTA stops.")
    if args.embedded_origin and config.auth.mode == "sigv4":
        import tomllib

        principal = tomllib.loads(Path(config.auth.credentials).read_text())["principal"][0]
        lines += [
            "Use these credentials:",
            f"  export AWS_ACCESS_KEY_ID={principal['access_key_id']}",
            f"  export AWS_SECRET_ACCESS_KEY={principal['secret_access_key']}",
            "  export AWS_DEFAULT_REGION=us-east-1",
        ]
    lines.append(
        f"Try:  aws --endpoint-url {url} s3 mb s3://demo && aws --endpoint-url {url} s3 ls"
    )
    print("\n".join(lines), flush=True)


def _warm(args: argparse.Namespace) -> int:
    from lota.admin_client import warm

    if not args.url.startswith("s3://"):
        raise ConfigError(f"expected s3://bucket/prefix, got {args.url!r}")
    if not args.endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"--endpoint must be an http:// or https:// URL, got {args.endpoint!r}")
    bucket, _, prefix = args.url[5:].partition("/")
    result: list[int] = []

    async def run() -> None:
        result.append(await warm(args.endpoint, bucket, prefix, args.concurrency))

    _run(run())
    return result[0]


def _credentials_new(args: argparse.Namespace) -> int:
    from lota.auth.credentials import write_new

    principal = write_new(args.file, args.name)
    print(
        f"wrote {args.file}: principal {principal.name}, allowed everything (edit its policy).\n"
        f"Serve with --credentials {args.file} (or LOTA_AUTH_CREDENTIALS), and sign with:\n"
        f"  export AWS_ACCESS_KEY_ID={principal.access_key_id}\n"
        f"  export AWS_SECRET_ACCESS_KEY={principal.secret_access_key}"
    )
    return 0


def _migrations(args: argparse.Namespace) -> int:
    import json

    from lota.catalog import open_catalog
    from lota.clock import Clock
    from lota.node.admin import migration_report

    config = configuration.load(args.config or os.environ.get("LOTA_CONFIG"))
    if not config.catalog.url:
        raise ConfigError(
            "write acceleration is off: no catalog to read from ([catalog] url, LOTA_CATALOG_URL)"
        )
    report: dict[str, float | int] = {}

    async def run() -> None:
        catalog = await open_catalog(
            config.catalog.url, clock=Clock.from_environment(), node=config.node
        )
        try:
            report.update(migration_report(await catalog.pending_summary()))
        finally:
            await catalog.close()

    _run(run())
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"pending: {report['pending']} versions, {report['pending_bytes']} bytes; "
            f"oldest {report['oldest_age_seconds']}s; failing: {report['failing']}"
        )
    return 0


def _lifecycle_plan(args: argparse.Namespace) -> int:
    import uvloop

    from lota.lifecycle.cli import plan_command

    return uvloop.run(plan_command(args.config, args.bucket, args.now, args.json, sys.stdout))


def _lifecycle_run(args: argparse.Namespace) -> int:
    import uvloop

    from lota.lifecycle.cli import run_command

    return uvloop.run(run_command(args.config, args.now))


def _lifecycle_status(args: argparse.Namespace) -> int:
    import uvloop

    from lota.lifecycle.cli import status_command

    return uvloop.run(status_command(args.config, args.url, args.now, args.json, sys.stdout))


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop (the serving path's event loop)."""
    import uvloop

    uvloop.run(main)
