"""An embedded S3 origin: moto's S3 server in a child process, optionally behind a WAN link.

``make serve``, ``make demo``, the benchmarks and the functional tests need a real S3
endpoint without an AWS account. :class:`EmbeddedOrigin` starts one on a free loopback
port and, given a latency or a bandwidth, puts an emulated WAN (:class:`lota.testing.wan.WanLink`)
in front of it so that it behaves like a bucket in a far region::

    async with EmbeddedOrigin(latency=0.03, bandwidth=12.5e6) as origin:
        s3 = boto3.client("s3", endpoint_url=origin.endpoint, region_name="us-east-1",
                          aws_access_key_id=origin.access_key_id,
                          aws_secret_access_key=origin.secret_access_key)

Pytest fixtures without an event loop use :func:`moto_server` instead.

Why it is built this way:

- moto runs in a subprocess, not a thread, so that its request handling does not compete
  with the serving process for the GIL.
- This process binds the listening socket and hands it to the child (``--fd``): with port 0
  there is no window in which another process can take the port between choosing and binding.
- The child serves path-style requests (``http://127.0.0.1:PORT/bucket/key``) and verifies no
  signatures, so any credentials work.
- The child watches its stdin, a pipe this process holds: if this process dies without closing
  it (``kill -9``, a crashed test run), the pipe closes and moto exits instead of lingering.
- moto's log (per-request lines off, warnings and tracebacks on) goes to an anonymous
  temporary file whose tail is shown when startup fails.
- moto reads (and copies) a whole object for every ranged GET: a cold 1 GiB object read
  in 8 MiB ranges would be 128 GiB of copying. :class:`_RangedReads` answers the plain
  ranged GET from the bytes asked for only, after moto has answered a HEAD of the same
  request (conditions, errors and headers stay moto's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from lota.errors import OriginStartError
from lota.testing.wan import WanLink, format_bandwidth

_log = logging.getLogger("lota.embedded")

HOST = "127.0.0.1"
READY_TIMEOUT = 30.0
STOP_GRACE = 5.0
_PROBE_TIMEOUT = 2.0
_LOG_TAIL_BYTES = 4000


class _MotoProcess:
    """moto's server in a child process, serving on a socket this process bound."""

    def __init__(self, port: int = 0, region: str = "us-east-1") -> None:
        self.port = port
        self.region = region
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def spawn(self) -> None:
        with _listen(self.port) as listener:
            self.port = int(listener.getsockname()[1])
            # Kept open for the child's lifetime (its stderr) and closed by stop().
            self._log = tempfile.TemporaryFile(prefix="lota-moto-", suffix=".log")  # noqa: SIM115
            fd = listener.fileno()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "lota.embedded", "--fd", str(fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                pass_fds=(fd,),
                env=self._environment(),
            )

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # moto verifies signatures only after this many unauthenticated calls; unset is never.
        env.pop("INITIAL_NO_AUTH_ACTION_COUNT", None)
        env["MOTO_PORT"] = str(self.port)
        env["AWS_DEFAULT_REGION"] = self.region
        # The child must import this package even when it is not installed (a source checkout).
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Poll ``GET /`` (ListBuckets) until it answers 200; fail early if moto exits."""
        deadline = time.monotonic() + timeout
        while not self.probe():
            if time.monotonic() > deadline:
                raise self.failure(f"moto did not answer on {self.endpoint} within {timeout:g} s")
            time.sleep(0.05)

    def probe(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            code = self._proc.returncode if self._proc else None
            raise self.failure(f"moto exited with status {code} before answering")
        conn = http.client.HTTPConnection(HOST, self.port, timeout=_PROBE_TIMEOUT)
        try:
            conn.request("GET", "/")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def failure(self, reason: str) -> OriginStartError:
        return OriginStartError(f"{reason}; moto's log ends with:\n{self.log_tail()}")

    def log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, self._log.tell() - _LOG_TAIL_BYTES))
        return self._log.read().decode(errors="replace")

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, SIGKILL if moto is still there after ``grace`` seconds (0: at once)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                _terminate(proc, grace)
            finally:
                _close_quietly(proc.stdin)
        log, self._log = self._log, None
        _close_quietly(log)


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    if grace > 0:
        proc.terminate()
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            _log.warning("moto (pid %d) ignored SIGTERM for %g s; killing it", proc.pid, grace)
    proc.kill()
    proc.wait()


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OriginStartError(f"cannot listen on {HOST}:{port}: {exc}") from exc
    return sock


def _close_quietly(stream: IO[bytes] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError):
            stream.close()


@contextlib.contextmanager
def moto_server(port: int = 0) -> Iterator[str]:
    """moto's S3 server in a subprocess for synchronous code (pytest fixtures); yields its URL."""
    with moto_servers(1, port) as (endpoint,):
        yield endpoint


@contextlib.contextmanager
def moto_servers(count: int, port: int = 0) -> Iterator[list[str]]:
    """`count` moto S3 servers started side by side (one per region); yields their URLs."""
    motos = [_MotoProcess(port if count == 1 else 0) for _ in range(count)]
    try:
        for moto in motos:
            moto.spawn()
        for moto in motos:
            moto.wait_ready()
        yield [moto.endpoint for moto in motos]
    finally:
        for moto in motos:
            moto.stop()


class EmbeddedOrigin:
    """A local S3 origin for demos, ``make serve``, benchmarks and tests (async context manager).

    ``endpoint`` is what clients use: through a :class:`~lota.testing.wan.WanLink` when ``latency``
    or ``bandwidth`` is given, else moto itself (``direct_endpoint``). ``wan`` exposes the
    link's byte counters, i.e. what crossed the "WAN" to the origin.
    """

    access_key_id = "lota-origin"
    secret_access_key = "lota-origin-secret"  # moto accepts any credentials

    def __init__(
        self,
        *,
        latency: float = 0.0,
        bandwidth: float | None = None,
        port: int = 0,
        region: str = "us-east-1",
    ) -> None:
        self.latency = latency
        self.bandwidth = bandwidth
        self.region = region
        self.wan: WanLink | None = None
        self._moto = _MotoProcess(port, region)
        self._started = False

    @property
    def port(self) -> int:
        """moto's own port."""
        return self._moto.port

    @property
    def pid(self) -> int | None:
        return self._moto.pid

    @property
    def direct_endpoint(self) -> str:
        self._check_started()
        return self._moto.endpoint

    @property
    def endpoint(self) -> str:
        self._check_started()
        return self.wan.endpoint if self.wan else self._moto.endpoint

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError("EmbeddedOrigin is not started")

    async def __aenter__(self) -> EmbeddedOrigin:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start moto and wait until it answers (up to 30 s), then the WAN link if any."""
        if self._started:
            raise RuntimeError("EmbeddedOrigin already started")
        try:
            self._moto.spawn()
            await asyncio.to_thread(self._moto.wait_ready)
            if self.latency > 0 or self.bandwidth is not None:
                await self._start_wan()
        except BaseException:
            # Also on cancellation: SIGKILL is immediate and cannot leave moto behind.
            self._moto.stop(grace=0)
            raise
        self._started = True
        _log.info("embedded S3 origin (moto, pid %s) on %s", self.pid, self._moto.endpoint)

    async def _start_wan(self) -> None:
        self.wan = WanLink(HOST, self._moto.port, latency=self.latency, bandwidth=self.bandwidth)
        await self.wan.start()
        _log.info(
            "embedded origin behind an emulated WAN on %s: %g ms each way, %s",
            self.wan.endpoint,
            self.latency * 1e3,
            format_bandwidth(self.bandwidth),
        )

    async def close(self) -> None:
        """Close the WAN link and terminate moto, even if closing the link fails."""
        wan, self.wan = self.wan, None
        self._started = False
        try:
            if wan is not None:
                await wan.close()
        finally:
            await asyncio.to_thread(self._moto.stop)


# Storage classes whose objects a GET cannot read until they are restored.
_ARCHIVED = frozenset({"GLACIER", "DEEP_ARCHIVE"})


class _RangedReads:
    """WSGI middleware: a GET of an object with one Range and no query is answered with
    moto's headers for a HEAD of the same request and the range's bytes read from the
    object alone; anything else, or anything unexpected, is moto's own answer."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        plain = (
            environ.get("REQUEST_METHOD") == "GET"
            and environ.get("HTTP_RANGE", "").startswith("bytes=")
            and not environ.get("QUERY_STRING")
        )
        answer = self._ranged(environ) if plain else None
        if answer is None:
            return self._app(environ, start_response)
        status, headers, body = answer
        start_response(status, headers)
        return [body]

    def _ranged(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes] | None:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        head: dict[str, Any] = {}

        def record(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
            head["status"], head["headers"] = status, headers

        body = self._app({**environ, "REQUEST_METHOD": "HEAD"}, record)
        with contextlib.closing(body) if hasattr(body, "close") else contextlib.nullcontext():
            for _ in body:
                pass
        if not head.get("status", "").startswith("206"):
            return None
        headers = dict((k.lower(), v) for k, v in head["headers"])
        try:
            path = environ["PATH_INFO"].encode("latin-1").decode("utf-8")
            bucket, key = path.lstrip("/").split("/", 1)
            span, _ = headers["content-range"].split(" ", 1)[1].split("/", 1)
            first, last = (int(n) for n in span.split("-"))
            backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
            obj = backend.get_object(bucket, key)
            if obj is None or obj.storage_class in _ARCHIVED:
                return None  # moto decides what an archived object's GET answers
            with obj.lock:
                if obj.etag != headers.get("etag"):
                    return None  # replaced since the HEAD: let moto answer
                obj._value_buffer.seek(first)
                data = obj._value_buffer.read(last - first + 1)
        except Exception:  # moto changed, or an odd request: moto's own (slow) answer
            return None
        if len(data) != last - first + 1:
            return None
        return head["status"], head["headers"], data


def _serve_inherited_socket(fd: int) -> None:
    """The child process: serve moto on the socket the parent bound, until SIGTERM or orphaned."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    # Werkzeug logs every request at INFO; keep warnings and tracebacks only.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    threading.Thread(target=_exit_with_parent, name="lota-parent-watch", daemon=True).start()
    app = _RangedReads(DomainDispatcherApplication(create_backend_app))
    server = make_server(HOST, 0, app, threaded=True, request_handler=MotoRequestHandler, fd=fd)
    server.serve_forever()


def _exit_with_parent() -> None:
    """The parent holds our stdin open and never writes to it: EOF means it is gone."""
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Internal entry point of the child process; start origins with :class:`EmbeddedOrigin`."""
    parser = argparse.ArgumentParser(prog="python -m lota.embedded")
    parser.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    args = parser.parse_args(argv)
    _serve_inherited_socket(args.fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
