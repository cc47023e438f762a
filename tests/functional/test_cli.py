"""The ``lota`` command as a new user meets it: help, version, credentials, and start-up
problems said in one line with exit status 2 (never a traceback)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from lota import __version__
from lota.testing.processes import free_port

REPO = Path(__file__).resolve().parents[2]


def lota(
    *args: str, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m lota ARGS`` with no LOTA_* or AWS_* of this process's environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_"))}
    return subprocess.run(
        [sys.executable, "-m", "lota", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "LOTA_LOG_LEVEL": "WARNING", **(env or {})},
        check=False,
        **kw,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_version_and_help_say_what_the_commands_are_without_later_or_markup() -> None:
    version = lota("--version")
    assert (version.returncode, version.stdout) == (0, f"lota {__version__}\n")
    helped = lota("--help")
    assert helped.returncode == 0
    for command in ("serve", "warm", "credentials", "migrations", "lifecycle"):
        assert command in helped.stdout
    assert "later" not in helped.stdout and "``" not in helped.stdout
    assert "LOTA_<SECTION>_<KEY>" in helped.stdout


def test_credentials_new_writes_a_key_pair_that_signs_and_never_overwrites(
    origin: str, tmp_path: Path
) -> None:
    path = tmp_path / "creds.toml"
    made = lota("credentials", "new", str(path))
    assert made.returncode == 0, made.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    key = re.search(r"export AWS_ACCESS_KEY_ID=(\S+)", made.stdout)
    secret = re.search(r"export AWS_SECRET_ACCESS_KEY=(\S+)", made.stdout)
    assert key and secret
    again = lota("credentials", "new", str(path))
    assert one_line_error(again) == (
        f"lota: configuration error: {path} exists already; LOTA does not overwrite credentials"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lota", "serve", "--credentials", str(path)],
        env={**os.environ, "LOTA_ORIGIN": origin, "LOTA_LISTEN": f"127.0.0.1:{port}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, proc)
        assert _can_list_buckets(port, key.group(1), secret.group(1))
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_make_serve_with_lota_origin_serves_with_credentials_it_made(
    origin: str, tmp_path: Path
) -> None:
    """The README's ``LOTA_ORIGIN=http://... make serve`` used to refuse to start."""
    port, creds = free_port(), tmp_path / "credentials.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_", "MAKE"))}
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "-C", str(REPO), "serve", f"CREDENTIALS={creds}"],
        env={**env, "LOTA_ORIGIN": origin, "LOTA_LISTEN": f"127.0.0.1:{port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_port(port, proc, timeout=120)
        assert creds.exists()
        with open(creds, encoding="utf-8") as f:
            text = f.read()
        key = re.search(r'access_key_id = "(\S+)"', text)
        secret = re.search(r'secret_access_key = "(\S+)"', text)
        assert key and secret
        assert _can_list_buckets(port, key.group(1), secret.group(1))
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        assert proc.stdout is not None
        with proc.stdout:  # closed even when the read fails (a timeout): no stray warning
            printed = proc.stdout.read()  # until the last of lota's processes has exited
    assert "export AWS_ACCESS_KEY_ID=" in printed


def test_a_port_in_use_is_one_line_and_exit_2(origin: str, credentials_file: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = lota(
            "serve", "--origin", origin, "--credentials", str(credentials_file),
            "--listen", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert one_line_error(done).startswith(
        f"lota: cannot listen on 127.0.0.1:{port}: address already in use (is another process"
    )


def test_embedded_origin_without_moto_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocked = (
        "import sys; sys.modules['moto'] = None; from lota.cli import main; "
        "raise SystemExit(main(['serve', '--embedded-origin', '--listen', '127.0.0.1:0']))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_"))}
    done = subprocess.run(
        [sys.executable, "-c", blocked],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "LOTA_LOG_LEVEL": "WARNING"},
        cwd=tmp_path,
        check=False,
    )
    assert one_line_error(done).startswith(
        "lota: --embedded-origin needs moto, which is not installed: pip install 'lota[embedded]'"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"LOTA_CACHE_READAHEAD": "abc"},
            "lota: configuration error: LOTA_CACHE_READAHEAD must be a whole number, got 'abc'",
        ),
        (
            {"LOTA_CATALOG": "sqlite:////tmp/x.db"},
            "lota: configuration error: unknown variable LOTA_CATALOG: settings come from "
            "LOTA_<SECTION>_<KEY> (see the configuration reference in the README); "
            "did you mean LOTA_CATALOG_URL?",
        ),
        (
            {"LOTA_WRITE_CATALOG": "sqlite:////tmp/x.db"},
            "lota: configuration error: unknown variable LOTA_WRITE_CATALOG: settings come from "
            "LOTA_<SECTION>_<KEY> (see the configuration reference in the README); "
            "did you mean LOTA_CATALOG_URL?",
        ),
        (
            {"LOTA_CACHE_DIRS": "/tmp/a:/tmp/b"},
            "lota: configuration error: cache.dirs: '/tmp/a:/tmp/b' has a ':'; list several "
            "directories as a TOML list or comma-separated (LOTA_CACHE_DIRS=/nvme0/lota,/nvme1/lota)",
        ),
        (
            {},
            'lota: configuration error: auth.mode = "sigv4" (the default) needs '
            "auth.credentials, a credentials file (make one with `lota credentials new FILE`), "
            'or auth.mode = "none" on a trusted network',
        ),
    ],
)
def test_a_bad_variable_refuses_start_up_in_one_line(
    env: dict[str, str], expected: str, origin: str
) -> None:
    done = lota("serve", "--listen", "127.0.0.1:0", env={"LOTA_ORIGIN": origin, **env})
    assert one_line_error(done) == expected


def test_the_old_write_catalog_setting_refuses_start_up_in_one_line_naming_the_new_one(
    origin: str, tmp_path: Path
) -> None:
    config = tmp_path / "lota.toml"
    config.write_text(f'[write]\ncatalog = "sqlite:///{tmp_path}/catalog.db"\n')
    done = lota("serve", "--config", str(config), env={"LOTA_ORIGIN": origin})
    assert one_line_error(done) == (
        "lota: configuration error: write.catalog has moved: set [catalog] url (LOTA_CATALOG_URL)"
    )


def test_migrations_and_lifecycle_plan_need_no_client_credentials(tmp_path: Path) -> None:
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    migrations = lota("migrations", env={"LOTA_CATALOG_URL": catalog})
    assert migrations.returncode == 0, migrations.stderr
    assert migrations.stdout.startswith("pending: 0 versions, 0 bytes")
    nothing = lota("migrations")
    assert one_line_error(nothing) == (
        "lota: configuration error: write acceleration is off: no catalog to read from "
        "([catalog] url, LOTA_CATALOG_URL)"
    )


def test_lifecycle_plan_says_when_nothing_would_move(
    origin: str, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="runs/1/small.bin", Body=b"x" * 100)
    rules = [{"bucket": bucket, "transitions": [{"days_since_last_access": 0, "tier": "cold"}]}]
    env = {
        "LOTA_CATALOG_URL": f"sqlite:///{tmp_path}/catalog.db",
        "LOTA_ORIGIN": origin,
        "AWS_ACCESS_KEY_ID": "lota-origin",
        "AWS_SECRET_ACCESS_KEY": "lota-origin-secret",
        "LOTA_LIFECYCLE_RULES": json.dumps(rules),
    }
    plan = lota("lifecycle", "plan", env=env)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout == (
        "lota lifecycle: nothing would move (no object is due for a transition; "
        "objects under a rule's min_size never move)\n"
    )
    as_json = lota("lifecycle", "plan", "--json", env=env)
    assert (as_json.returncode, as_json.stdout) == (0, "")
    rules[0]["bucket"] = "no-such-bucket-here"
    missing = lota("lifecycle", "plan", env={**env, "LOTA_LIFECYCLE_RULES": json.dumps(rules)})
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        "lota: listing no-such-bucket-here/ at the origin: 404 NoSuchBucket"
    ]


def _can_list_buckets(port: int, key: str, secret: str) -> bool:
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )
    return "Buckets" in s3.list_buckets()


def _wait_for_port(port: int, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "lota exited before it listened"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on {port} within {timeout} s")
