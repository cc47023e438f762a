"""A range-capable S3-like origin for benchmarks: files under a directory, sent with sendfile.

``GET`` and ``HEAD`` of ``/BUCKET/KEY`` serve ``ROOT/BUCKET/KEY`` with ``ETag``,
``Last-Modified``, ``Content-Length``, one ``Range`` (206 with ``Content-Range``, 416
past the end) and ``If-Match`` (412); keep-alive HTTP/1.1, a thread per connection, the
body sent with ``os.sendfile`` so the origin costs next to nothing and a benchmark
measures LOTA, not the origin. Signatures are not checked. moto, the test origin, has
to run every request through its Python object model; this one is what a fast S3 looks
like from LOTA's side, for the cold-read bench.

    python -m bench.origin --root DIR --port-file FILE      # prints nothing; see FILE
"""

from __future__ import annotations

import argparse
import email.utils
import os
import re
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = Path(".")

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self.root / unquote(urlsplit(self.path).path).lstrip("/")
        if not path.is_file() or ".." in path.parts:
            self._status(404, b"<Error><Code>NoSuchKey</Code></Error>")
            return
        stat = path.stat()
        etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
        if self.headers.get("if-match", etag) != etag:
            self._status(412, b"<Error><Code>PreconditionFailed</Code></Error>")
            return
        first, last, status = 0, stat.st_size - 1, 200
        wanted = _RANGE.fullmatch(self.headers.get("range", "").replace(" ", ""))
        if wanted:
            first, last, status = _span(wanted.group(1), wanted.group(2), stat.st_size)
            if status == 416:
                self._status(416, b"<Error><Code>InvalidRange</Code></Error>")
                return
        self.send_response(status)
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{stat.st_size}")
        self.end_headers()
        self.wfile.flush()
        if body:
            with path.open("rb") as f:
                offset, end = first, last + 1
                while offset < end:
                    offset += os.sendfile(
                        self.connection.fileno(), f.fileno(), offset, end - offset
                    )

    def _status(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _span(start: str, end: str, size: int) -> tuple[int, int, int]:
    if not start:  # a suffix
        count = min(int(end or 0), size)
        return (size - count, size - 1, 206) if count else (0, 0, 416)
    first = int(start)
    last = min(int(end), size - 1) if end else size - 1
    return (first, last, 206) if first < size and first <= last else (0, 0, 416)


class FileOrigin:
    """The origin in a subprocess; ``endpoint`` is its URL while the block runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.endpoint = ""
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FileOrigin:
        ready = self.root / ".port"
        ready.unlink(missing_ok=True)
        command = [sys.executable, "-m", "bench.origin", "--root", str(self.root)]
        self._proc = subprocess.Popen([*command, "--port-file", str(ready)])
        deadline = time.monotonic() + 10
        try:
            while not (ready.exists() and ready.read_text()):
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise RuntimeError("the file origin did not start")
                time.sleep(0.02)
        except BaseException:  # failed, or interrupted (SIGTERM): not left running
            self.__exit__(None, None, None)
            raise
        self.port = int(ready.read_text())
        self.endpoint = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.origin")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    _Handler.root = args.root.resolve()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    args.port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
