"""The access log: one line per request, handed to the log writer in batches."""

from __future__ import annotations

import asyncio
import logging
import queue
import re
from collections.abc import Iterator

import pytest

from lota import logs

LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO lota\.access "
    r'127\.0\.0\.1 "GET /b/k\d+" 200 GetObject 1\.5ms id=R\d+ '
    r"cache=HIT out=\d+ in=0 principal=trainer"
)


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[queue.SimpleQueue[logging.LogRecord]]:
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    monkeypatch.setattr(logs, "_batches", [records])
    access = logging.getLogger(logs.ACCESS)
    access.setLevel(logging.INFO)
    yield records
    access.setLevel(logging.NOTSET)


def write(log: logs.AccessLog, n: int) -> None:
    log.write(
        "127.0.0.1",
        "GET",
        f"/b/k{n}",
        200,
        "GetObject",
        0.0015,
        f"R{n}",
        cache="HIT",
        sent=n,
        principal="trainer",
    )


def drained(records: queue.SimpleQueue[logging.LogRecord]) -> list[str]:
    formatter = logs._Formatter(logs.FORMAT)
    out = []
    while not records.empty():
        out += formatter.format(records.get()).split("\n")
    return out


async def test_lines_reach_the_writer_in_one_batch_soon_after(
    writer: queue.SimpleQueue[logging.LogRecord],
) -> None:
    log = logs.AccessLog()
    for n in range(3):
        write(log, n)
    assert writer.empty()
    await asyncio.sleep(logs.FLUSH_AFTER * 3)
    assert writer.qsize() == 1
    lines = drained(writer)
    assert len(lines) == 3 and all(LINE.fullmatch(line) for line in lines), lines
    assert [line.split()[6] for line in lines] == ['/b/k0"', '/b/k1"', '/b/k2"']


async def test_a_full_batch_goes_at_once_and_flush_sends_the_rest(
    writer: queue.SimpleQueue[logging.LogRecord],
) -> None:
    log = logs.AccessLog()
    for n in range(logs.FLUSH_LINES + 2):
        write(log, n)
    assert writer.qsize() == 1
    log.flush()  # what the node does when it stops
    assert len(drained(writer)) == logs.FLUSH_LINES + 2


async def test_without_the_writer_thread_lines_go_through_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=logs.ACCESS)
    write(logs.AccessLog(), 7)
    assert [r.getMessage() for r in caplog.records] == [
        '127.0.0.1 "GET /b/k7" 200 GetObject 1.5ms id=R7 cache=HIT out=7 in=0 principal=trainer'
    ]


async def test_a_refused_request_says_why_and_who_was_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=logs.ACCESS)
    logs.AccessLog().write(
        "10.0.0.1", "PUT", "/b/k", 403, "PutObject", 0.001, "R1", received=12,
        error="SignatureDoesNotMatch",
    )  # fmt: skip
    assert caplog.records[0].getMessage() == (
        '10.0.0.1 "PUT /b/k" 403 PutObject 1.0ms id=R1 cache=- out=0 in=12 principal=-'
        " err=SignatureDoesNotMatch"
    )


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        (
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20250101%2Fus-east-1"
            "%2Fs3%2Faws4_request&X-Amz-Date=20250101T000000Z&X-Amz-Expires=60"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=" + "ab12" * 16,
            "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20250101%2Fus-east-1"
            "%2Fs3%2Faws4_request&X-Amz-Date=20250101T000000Z&X-Amz-Expires=60"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=REDACTED",
        ),
        (
            "/b/k?AWSAccessKeyId=AK&Signature=a%2Bb%3D&Expires=9&x-amz-security-token=t0k",
            "/b/k?AWSAccessKeyId=AK&Signature=REDACTED&Expires=9&x-amz-security-token=REDACTED",
        ),
        ("/b/k?X-Amz-Signature=1&Signature=2", "/b/k?X-Amz-Signature=REDACTED&Signature=REDACTED"),
        ("/b/Signature=in-the-key", "/b/Signature=in-the-key"),
        ("/b/k?list-type=2&prefix=Signature", "/b/k?list-type=2&prefix=Signature"),
    ],
)
async def test_presigned_signatures_and_tokens_never_reach_the_log(
    caplog: pytest.LogCaptureFixture, path: str, logged: str
) -> None:
    caplog.set_level(logging.INFO, logger=logs.ACCESS)
    logs.AccessLog().write("127.0.0.1", "GET", path, 200, "GetObject", 0.001, "R1")
    assert f'"GET {logged}" 200 ' in caplog.records[0].getMessage()


async def test_nothing_is_written_when_the_access_log_is_off(
    writer: queue.SimpleQueue[logging.LogRecord],
) -> None:
    logging.getLogger(logs.ACCESS).setLevel(logging.WARNING)
    log = logs.AccessLog()
    write(log, 1)
    log.flush()
    assert writer.empty()
