"""Real LOTA nodes as processes, for tests, benchmarks and the demo.

A :class:`LotaProcess` is ``lota serve`` started through the real CLI on a free loopback
port, with ``readyz`` polled until it answers; :func:`aws_cli` runs the AWS CLI against a
node as one of the principals of :mod:`lota.testing.credentials`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from lota.testing.credentials import ORIGIN_KEYS, PRINCIPALS
from lota.testing.tls import unverified_context

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port that was free a moment ago (another process may take it before you do)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


AWS_CLI = "/usr/bin/aws"  # the Debian awscli package, installed by tests/setup_services.py


def aws_cli(endpoint: str, home: Path, *args: str, principal: str = "admin") -> tuple[str, str]:
    """Run the AWS CLI against `endpoint` as `principal`, with no config of the machine's
    (`home` stands in for $HOME); (stdout, stderr). A failure raises AssertionError."""
    key, secret, _ = PRINCIPALS[principal]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
        "AWS_PAGER": "",
    }
    done = subprocess.run(
        [AWS_CLI, "--endpoint-url", endpoint, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode:
        raise AssertionError(f"aws {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout, done.stderr


class LotaProcess:
    """``lota serve`` in a subprocess, on a free loopback port."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        nofile: int | None = None,
    ) -> None:
        """`nofile` starts the process with RLIMIT_NOFILE at that soft and hard limit."""
        self.nofile = nofile
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--listen", f"127.0.0.1:{self.port}", *args]
        self.log_path = log_path
        # One process per node unless a test asks for workers (the default is one per CPU).
        self.env = {**os.environ, **ORIGIN_KEYS, "LOTA_WORKERS": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0, *, ready: bool = True) -> LotaProcess:
        """Start it and wait until ``readyz`` says ready (or, `ready` False, answers at all:
        a node that is up but not ready, 503). A start that fails or is interrupted (a
        bench's SIGTERM) leaves no process running."""
        self.spawn()
        try:
            return self.wait_ready(timeout, ready=ready)
        except BaseException:
            self.kill()
            raise

    def spawn(self) -> LotaProcess:
        """Start it, not waiting (:meth:`wait_ready`): several nodes start side by side."""
        log = self.log_path.open("ab")
        limit = [] if self.nofile is None else ["prlimit", f"--nofile={self.nofile}", "--"]
        self.proc = subprocess.Popen(
            [*limit, sys.executable, "-m", "lota", "serve", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 30.0, *, ready: bool = True) -> LotaProcess:
        """Wait until the spawned process's ``readyz`` says ready (see :meth:`start`)."""
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        context = unverified_context()
        why = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lota exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(
                    self.url + "/_lota/readyz", timeout=1, context=context
                ) as r:
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError as err:
                if not ready and err.code == 503:
                    return self
                why = err.read().decode(errors="replace").strip()
                time.sleep(0.05)
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"lota did not become ready ({why}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/_lota/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
