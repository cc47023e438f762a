"""Client connections that send nothing, dawdle over a head, idle, or come by the thousand:
each is closed on time and real clients keep being served."""

from __future__ import annotations

import re
import resource
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from lota.testing.processes import LotaProcess
from tests.conftest import client_for
from tests.functional.test_errors import signed

HEADER_TIMEOUT = 1.5
KEEPALIVE_TIMEOUT = 3.0
SLACK = 1.0  # a closed connection is seen at most this long after its deadline
HEAD = b"GET /_lota/healthz HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def quick(
    origin: str, credentials_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LotaProcess]:
    """A node with short connection timeouts."""
    work = tmp_path_factory.mktemp("quick")
    node = _node(work, origin, credentials_file, HEADER_TIMEOUT, KEEPALIVE_TIMEOUT)
    yield node
    node.stop()


def _node(
    work: Path, origin: str, credentials: Path, header_timeout: float, keepalive_timeout: float
) -> LotaProcess:
    config = work / "lota.toml"
    config.write_text(
        f'header_timeout = "{header_timeout}s"\nkeepalive_timeout = "{keepalive_timeout}s"\n'
    )
    return LotaProcess(
        ["--config", str(config), "--origin", origin, "--credentials", str(credentials)],
        log_path=work / "lota.log",
    ).start()


def _closed_after(
    sock: socket.socket, trickle: bytes = b"", every: float = 0.2
) -> tuple[float, bytes]:
    """Seconds until the server closes `sock`, sending `trickle` a byte at a time meanwhile,
    and what it sent before closing."""
    started = time.monotonic()
    received = b""
    sock.settimeout(every)
    while time.monotonic() - started < 30:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if trickle:
                try:
                    sock.sendall(trickle[:1])
                except OSError:
                    break
                trickle = trickle[1:]
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return time.monotonic() - started, received


def _connect(node: LotaProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port), timeout=5)


def _error_code(response: bytes) -> tuple[int, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), ET.fromstring(body).findtext("Code") or ""


def test_a_connection_that_sends_nothing_is_closed_after_header_timeout(quick: LotaProcess) -> None:
    with _connect(quick) as sock:
        elapsed, received = _closed_after(sock)
    assert received == b""
    assert HEADER_TIMEOUT - 0.1 < elapsed < HEADER_TIMEOUT + SLACK


def test_a_connection_trickling_header_bytes_gets_408_after_header_timeout(
    quick: LotaProcess,
) -> None:
    with _connect(quick) as sock:
        # A byte every 0.2 s: never a whole head, never a quiet spell as long as the timeout.
        elapsed, received = _closed_after(sock, trickle=HEAD + b"X-Slow: " + b"a" * 200)
    assert _error_code(received) == (408, "RequestTimeout")
    assert HEADER_TIMEOUT - 0.1 < elapsed < HEADER_TIMEOUT + SLACK


def test_a_connection_sending_partial_headers_gets_408_after_header_timeout(
    quick: LotaProcess,
) -> None:
    with _connect(quick) as sock:
        sock.sendall(HEAD)  # no blank line: the head never ends
        elapsed, received = _closed_after(sock)
    assert _error_code(received) == (408, "RequestTimeout")
    assert HEADER_TIMEOUT - 0.1 < elapsed < HEADER_TIMEOUT + SLACK


def test_a_connection_idle_after_a_request_is_closed_after_keepalive_timeout(
    quick: LotaProcess,
) -> None:
    with _connect(quick) as sock:
        sock.sendall(HEAD + b"\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        elapsed, received = _closed_after(sock)
    assert received == b""
    # Not header_timeout after the response: a kept-alive connection may idle longer.
    assert KEEPALIVE_TIMEOUT - 0.1 < elapsed < KEEPALIVE_TIMEOUT + SLACK


def test_a_connection_used_again_idles_keepalive_timeout_from_its_last_response(
    quick: LotaProcess,
) -> None:
    """Its deadline moves on with each response, and the timer set when it opened is kept
    (lota.connections): that one fires while the connection is used, finds nothing due,
    and is set again. Never closed early, never left open."""
    with _connect(quick) as sock:
        sock.sendall(HEAD + b"\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT - 0.5)  # before that first timer fires
        sock.sendall(HEAD + b"\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        elapsed, received = _closed_after(sock)
    assert received == b""
    assert KEEPALIVE_TIMEOUT - 0.1 < elapsed < KEEPALIVE_TIMEOUT + SLACK


def test_a_kept_alive_connection_starting_a_head_late_gets_header_timeout_from_its_first_byte(
    quick: LotaProcess,
) -> None:
    with _connect(quick) as sock:
        sock.sendall(HEAD + b"\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(KEEPALIVE_TIMEOUT - 1.0)
        sock.sendall(HEAD)
        elapsed, received = _closed_after(sock)
    assert _error_code(received) == (408, "RequestTimeout")
    assert HEADER_TIMEOUT - 0.1 < elapsed < HEADER_TIMEOUT + SLACK


@pytest.fixture(scope="module")
def patient(
    origin: str, credentials_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LotaProcess]:
    """A node whose connections may idle far longer than a head may take (as by default:
    10 s and 75 s)."""
    node = _node(tmp_path_factory.mktemp("patient"), origin, credentials_file, 1, 6)
    yield node
    node.stop()


def test_a_head_begun_on_an_idle_connection_is_timed_from_its_first_byte_not_the_idle_time(
    patient: LotaProcess,
) -> None:
    """The connection's timer is set for its keep-alive deadline, 6 s away, when the head
    begins: the header clock's deadline is earlier, so the timer is set again for it."""
    with _connect(patient) as sock:
        sock.sendall(HEAD + b"\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(1.3)  # the timer set when it opened has fired, and now waits for 6 s
        sock.sendall(HEAD)
        elapsed, received = _closed_after(sock)
    assert _error_code(received) == (408, "RequestTimeout")
    assert 0.9 < elapsed < 1.0 + SLACK


def test_connections_closed_on_a_timeout_are_counted(quick: LotaProcess) -> None:
    def closed(reason: str) -> float:
        found = re.search(
            rf'lota_client_connections_closed_total{{reason="{reason}"}} (\S+)', quick.metrics()
        )
        return float(found.group(1)) if found else 0.0

    before = closed("header_timeout")
    with _connect(quick) as sock:
        _closed_after(sock)
    assert closed("header_timeout") == before + 1


def test_2000_idle_connections_do_not_stop_a_real_client(
    origin: str, credentials_file: Path, tmp_path: Path, bucket: str
) -> None:
    # As in the report: 1,024 descriptors, more idle connections than that.
    node = LotaProcess(
        ["--origin", origin, "--credentials", str(credentials_file)],
        log_path=tmp_path / "lota.log",
        nofile=1024,
    ).start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2200 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    idle: list[socket.socket] = []
    # An upload under way when the crowd arrives: its connection is busy, never given up.
    upload = signed(node, "PUT", f"/{bucket}/in-flight", b"u" * 100_000)
    busy = _connect(node)
    try:
        busy.sendall(upload[:-50_000])
        for _ in range(2000):
            idle.append(socket.create_connection(("127.0.0.1", node.port), timeout=5))
        busy.sendall(upload[-50_000:])
        assert busy.recv(65536).startswith(b"HTTP/1.1 200")
        s3 = client_for(node.url, retries={"max_attempts": 1}, connect_timeout=5, read_timeout=10)
        started = time.monotonic()
        s3.put_object(Bucket=bucket, Key="k", Body=b"through the crowd")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"through the crowd"
        assert time.monotonic() - started < 3.0
        metrics = node.metrics()
    finally:
        for sock in [busy, *idle]:
            sock.close()
        node.stop()
    cap = _gauge(metrics, "lota_client_connection_limit")
    assert 0 < cap < 1024
    assert _gauge(metrics, "lota_client_connections") <= cap
    assert "descriptor limit 1024 (hard 1024)" in node.log_tail(200)


def _gauge(metrics: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    assert found, name
    return float(found.group(1))
