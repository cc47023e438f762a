"""Small hits answered as the connection parses them (lota.node.listener, lota.node.at_once):
the same responses :meth:`Front.handle` gives, in order on a connection whatever else it
carries, refused when the signature is wrong or has expired, never from a cache entry
that changed, and counted as every other response is."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp.http_parser import RawRequestMessage

from lota import zerocopy
from lota.auth import Authenticator
from lota.cache.deliver import Deliverer
from lota.catalog import open_catalog
from lota.clock import FakeClock
from lota.lifecycle.access import AccessRecorder
from lota.lru import SizedLru
from lota.node import listener
from lota.node.at_once import MAX_CHARS, AtOnce
from lota.node.listener import Later, S3RequestHandler
from lota.regions.pending import PendingKeys
from lota.testing.node import InProcessNode, node_config, running_node
from lota.zerocopy import FileSpan
from tests.conftest import client_for, presigned_get

Reply = tuple[int, list[tuple[str, str]], bytes]


@dataclass
class Offer:
    """A request offered to AtOnce: parsed (``answer``) or as its bytes (``again``)."""

    at_once: AtOnce
    how: str
    reply: Any


def _spy_offers(monkeypatch: pytest.MonkeyPatch, record: Callable[[Offer], None]) -> None:
    """Have `record` hear every offer made to AtOnce from here on, with what it replied."""
    answer, again = AtOnce.answer, AtOnce.again

    def spy_answer(
        self: AtOnce,
        message: RawRequestMessage,
        remote: str | None,
        waited: Later | None = None,
        raw: bytes | None = None,
        span: bool = False,
    ) -> Any:
        reply = answer(self, message, remote, waited, raw, span)
        record(Offer(self, "answer", reply))
        return reply

    def spy_again(self: AtOnce, raw: bytes, remote: str | None, span: bool = False) -> Any:
        reply = again(self, raw, remote, span)
        record(Offer(self, "again", reply))
        return reply

    monkeypatch.setattr(AtOnce, "answer", spy_answer)
    monkeypatch.setattr(AtOnce, "again", spy_again)


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each request offered to AtOnce was answered at once: parsed, or from its
    bytes before parsing (what ``again`` declines is offered parsed; a request told to
    wait, Later, is offered again)."""
    seen: list[bool] = []

    def record(offer: Offer) -> None:
        if isinstance(offer.reply, Later) or (offer.how == "again" and offer.reply is None):
            return
        seen.append(offer.reply is not None)

    _spy_offers(monkeypatch, record)
    return seen


@asynccontextmanager
async def _node(
    origin: str, credentials: Path, cache: Path, **more: str
) -> AsyncIterator[InProcessNode]:
    settings = {
        "origin": origin,
        "auth.mode": "sigv4",
        "auth.credentials": str(credentials),
        "cache.dirs": [str(cache)],
        "cache.revalidate_after": "1h",
        **more,
    }
    async with running_node(node_config(settings)) as node:
        yield node


@dataclass
class OneObject:
    """A node in front of one 5,000-byte object ``k``: its presigned GET, that request's
    bytes, and one connection to the node."""

    node: InProcessNode
    body: bytes
    url: str
    whole: bytes
    conn: Connection


@asynccontextmanager
async def _one_object(
    origin: str, origin_s3: Any, bucket: str, credentials: Path, tmp_path: Path
) -> AsyncIterator[OneObject]:
    body = os.urandom(5000)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=body)
    async with _node(origin, credentials, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        conn = await Connection.open(node.url)
        try:
            yield OneObject(node, body, url, request(url), conn)
        finally:
            conn.close()


class PagesGone:
    """Deliverer.read_now finds nothing at hand (as when a chunk's pages are gone from the
    page cache) from when `gone` is set until bring_to_hand brings the bytes back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gone = True
        read_now, bring = Deliverer.read_now, Deliverer.bring_to_hand

        def not_at_hand(*args: Any, **kwargs: Any) -> Any:
            return None if self.gone else read_now(*args, **kwargs)

        async def brought(*args: Any) -> bool:
            done = await bring(*args)
            self.gone = False
            return done

        monkeypatch.setattr(Deliverer, "read_now", not_at_hand)
        monkeypatch.setattr(Deliverer, "bring_to_hand", brought)


def _forged(url: str) -> bytes:
    """A GET of presigned `url` with its signature reversed (well-formed, wrong)."""
    signature = url.rsplit("X-Amz-Signature=", 1)[1]
    return request(url.replace(signature, signature[::-1]))


class Connection:
    """One keep-alive connection; requests may be written together (pipelined)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str, tls: ssl.SSLContext | None = None) -> Connection:
        parts = urlsplit(url)
        assert parts.hostname is not None
        return cls(*await asyncio.open_connection(parts.hostname, parts.port, ssl=tls))

    def send(self, *requests: bytes) -> None:
        self.writer.write(b"".join(requests))

    async def reply(self, method: str = "GET") -> Reply:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = [tuple(line.split(": ", 1)) for line in lines[1:] if line]
        length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
        no_body = method == "HEAD" or status == 304
        body = b"" if no_body else await self.reader.readexactly(length)
        return status, [(n, v) for n, v in headers], body

    async def get(self, request: bytes, method: str = "GET") -> Reply:
        self.send(request)
        return await self.reply(method)

    def close(self) -> None:
        self.writer.close()


def request(url: str, method: str = "GET", **headers: str) -> bytes:
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    fields = {"host": parts.netloc, **{k.replace("_", "-"): v for k, v in headers.items()}}
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return f"{method} {target} HTTP/1.1\r\n{lines}\r\n".encode()


async def _until_hit(conn: Connection, url: str) -> Reply:
    """Read `url` until the cache answers it (a fill commits after its reply)."""
    for _ in range(100):
        reply = await conn.get(request(url))
        if dict(reply[1]).get("x-lota-cache") == "HIT":
            return reply
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never became a hit")


def _without_date(reply: Reply) -> Reply:
    status, headers, body = reply
    body = re.sub(rb"<RequestId>\w+</RequestId>", b"", body)
    return status, [(n, v) for n, v in headers if n not in ("Date", "x-amz-request-id")], body


VARIANTS: list[tuple[str, dict[str, str]]] = [
    ("whole object", {}),
    ("a range", {"range": "bytes=100-4195"}),
    ("a suffix range", {"range": "bytes=-500"}),
    ("If-Match that holds", {"if-match": "*"}),
    ("If-None-Match that fails: 304", {"if-none-match": "*"}),
    ("If-Match that fails: 412", {"if-match": '"nope"'}),
    ("a range past the end: 416", {"range": "bytes=90000-"}),
    ("a response-content-type override", {}),
]


def _presigned(
    endpoint: str,
    bucket: str,
    key: str,
    operation: str = "get_object",
    expires: int = 600,
    **params: str,
) -> str:
    s3 = client_for(endpoint, signature_version="s3v4")
    wanted = {"Bucket": bucket, "Key": key, **params}
    return str(s3.generate_presigned_url(operation, wanted, ExpiresIn=expires))


async def test_hits_answered_at_once_are_the_responses_handle_gives(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = bytes(range(256)) * 256
    await asyncio.to_thread(
        origin_s3.put_object,
        Bucket=bucket,
        Key="k",
        Body=body,
        ContentType="text/plain",
        Metadata={"team": "vision"},
    )
    cache = tmp_path / "cache"

    async def replies() -> list[Reply]:
        async with _node(origin, credentials_file, cache) as node:
            url = presigned_get(node.url, bucket, "k")
            typed = _presigned(node.url, bucket, "k", ResponseContentType="image/png")
            conn = await Connection.open(node.url)
            try:
                await _until_hit(conn, url)
                out = [await conn.get(request(url, **headers)) for _, headers in VARIANTS[:-1]]
                return [*out, await conn.get(request(typed))]
            finally:
                conn.close()

    at_once = await replies()
    assert answered.count(True) >= 4, answered  # the hits were answered at once
    monkeypatch.setattr(AtOnce, "answer", lambda *args: None)
    monkeypatch.setattr(AtOnce, "again", lambda *args: None)
    handled = await replies()
    for (name, _), fast, slow in zip(VARIANTS, at_once, handled, strict=True):
        assert _without_date(fast) == _without_date(slow), name
    statuses = [status for status, _, _ in at_once]
    assert statuses == [200, 206, 206, 200, 304, 412, 416, 200]
    assert at_once[0][2] == body and at_once[1][2] == body[100:4196]
    assert at_once[2][2] == body[-500:]
    assert ("Content-Type", "image/png") in at_once[-1][1]


async def test_pipelined_requests_are_answered_in_order_whichever_way(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
) -> None:
    objects = {f"k{i}": bytes([i]) * (1000 + i) for i in range(3)}
    objects["k3"] = bytes(range(256)) * (64 * 1024 + 7)  # 16 MiB and more: a long miss
    for key, data in objects.items():
        await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key=key, Body=data)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        urls = {key: presigned_get(node.url, bucket, key) for key in objects}
        conn = await Connection.open(node.url)
        try:
            for key in ("k0", "k1"):
                await _until_hit(conn, urls[key])
            answered.clear()
            # Hits, a miss, a HEAD and a refused request, all in one write.
            forged = re.sub(r"X-Amz-Signature=\w+", "X-Amz-Signature=" + "0" * 64, urls["k0"])
            pipeline = [
                ("GET", urls["k0"], "HIT", 200),
                ("GET", urls["k2"], "MISS", 200),
                ("GET", urls["k1"], "HIT", 200),
                ("HEAD", _presigned(node.url, bucket, "k1", "head_object"), "HIT", 200),
                ("GET", forged, None, 403),
                ("GET", urls["k1"], "HIT", 200),
                ("GET", urls["k0"], "HIT", 200),
            ]
            conn.send(*(request(url, method) for method, url, _, _ in pipeline))
            for method, url, source, status in pipeline:
                got_status, headers, got = await conn.reply(method)
                key = urlsplit(url).path.rsplit("/", 1)[1]
                assert (got_status, dict(headers).get("x-lota-cache")) == (status, source)
                if status == 200 and method == "GET":
                    assert got == objects[key]
            # The first was answered at once; the miss and all behind it were not.
            assert answered[0] is True
            # A hit arriving while a miss is being answered waits for it.
            conn.send(request(urls["k3"]))
            await asyncio.sleep(0.02)
            conn.send(request(urls["k0"]))
            assert (await conn.reply())[2] == objects["k3"]
            assert (await conn.reply())[2] == objects["k0"]
            # Once the connection is quiet again, hits are answered at once again.
            answered.clear()
            await conn.get(request(urls["k1"]))
            assert answered == [True]
        finally:
            conn.close()


def _metric(text: str, pattern: str) -> float:
    found = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_hits_answered_at_once_are_counted_as_clients_saw_them(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
) -> None:
    data = b"m" * 70_000
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=data)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        conn = await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            counters: dict[str, Callable[[str], float]] = {
                "requests": lambda t: _metric(
                    t, r'lota_requests_total\{operation="GetObject",status="200"\}'
                ),
                "hits": lambda t: _metric(t, r'lota_cache_requests_total\{source="HIT"\}'),
                "bytes": lambda t: _metric(t, "lota_bytes_out_total"),
                "hit bytes": lambda t: _metric(t, r'lota_cache_bytes_total\{source="hit"\}'),
                "timed": lambda t: _metric(
                    t, r'lota_request_seconds_count\{operation="GetObject"\}'
                ),
                "timed hits": lambda t: _metric(
                    t, r'lota_cache_request_seconds_count\{source="HIT"\}'
                ),
                "fast": lambda t: _metric(
                    t, r'lota_cache_request_seconds_bucket\{le="0.001",source="HIT"\}'
                ),
            }
            before = await node.metrics()
            answered.clear()
            for _ in range(25):
                assert (await conn.get(request(url)))[2] == data
            after = await node.metrics()
        finally:
            conn.close()
    assert answered.count(True) == 25  # (the metrics calls are declined)
    seen = {name: count(after) - count(before) for name, count in counters.items()}
    # lota_bytes_out counts every response body: the first metrics call's too.
    seen["bytes"] -= len(before.encode())
    fast = seen.pop("fast")  # answered within 1 ms: most, on a quiet machine
    assert seen == {
        "requests": 25,
        "hits": 25,
        "bytes": 25 * 70_000,
        "hit bytes": 25 * 70_000,
        "timed": 25,
        "timed hits": 25,
    }
    assert 0 < fast <= 25


async def test_a_request_answered_again_is_refused_once_expired_and_never_stale(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
) -> None:
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"one" * 100)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        short = _presigned(node.url, bucket, "k", expires=2)
        conn = await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            assert (await conn.get(request(short)))[0] == 200
            answered.clear()
            for _ in range(3):
                assert (await conn.get(request(url)))[2] == b"one" * 100
            assert answered == [True] * 3
            # Past its expiry, the short URL is refused as S3 refuses it.
            await asyncio.sleep(2.5)
            status, _, body = await conn.get(request(short))
            assert status == 403 and b"expired" in body
            # Replaced through LOTA: the remembered answer is not given again.
            s3 = client_for(node.url)
            await asyncio.to_thread(s3.put_object, Bucket=bucket, Key="k", Body=b"two" * 50)
            status, _, body = await conn.get(request(url))
            assert (status, body) == (200, b"two" * 50)
            # Once the new version is a hit, the same URL is answered at once again.
            await _until_hit(conn, url)
            answered.clear()
            for _ in range(3):
                assert (await conn.get(request(url)))[2] == b"two" * 50
            assert answered == [True] * 3
        finally:
            conn.close()


def _spy_sends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """What each write from the page cache (lota.zerocopy.send) wrote, of how much."""
    sends: list[tuple[int, int]] = []
    send = zerocopy.send

    def spy(sock: zerocopy.Borrowed, head: bytes, span: FileSpan) -> int:
        sent = send(sock, head, span)
        sends.append((sent, len(head) + span.count))
        return sent

    monkeypatch.setattr(zerocopy, "send", spy)
    return sends


async def test_hits_answered_at_once_are_sent_from_the_page_cache(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit's body goes from the chunk's file to the socket (sendfile), not through a
    buffer; whole ranges and ranges within the chunk alike."""
    sends = _spy_sends(monkeypatch)
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        await _until_hit(one.conn, one.url)
        sends.clear()
        for _ in range(5):
            status, _, body = await one.conn.get(one.whole)
            assert (status, body == one.body) == (200, True)
        status, _, body = await one.conn.get(request(one.url, range="bytes=100-4195"))
        assert (status, body == one.body[100:4196]) == (206, True)
    assert len(sends) == (6 if zerocopy.AVAILABLE else 0)  # else copied, as the kernel wants
    assert all(sent == whole for sent, whole in sends)


async def test_a_chunk_cut_short_under_its_open_descriptor_cuts_the_connection_once(
    origin: str, origin_s3: Any, bucket: str, credentials_file: Path, tmp_path: Path
) -> None:
    """A chunk file cut short behind the cache's back (its descriptor kept open, its pages
    still in memory): the client sent from it loses its connection, never gets a short
    body as whole; the chunk is dropped, and the next read fetches it again, whole."""
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        await _until_hit(one.conn, one.url)
        chunks = [
            p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size == 5000
        ]
        assert len(chunks) == 1
        os.truncate(chunks[0], 4900)
        conn = one.conn
        if zerocopy.AVAILABLE:  # sent from the file: cut (else the read is found short)
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await asyncio.wait_for(conn.get(one.whole), 10)
            conn = await Connection.open(one.node.url)
        try:
            status, headers, body = await conn.get(one.whole)
        finally:
            conn.close()
        assert (status, dict(headers)["x-lota-cache"], body == one.body) == (200, "MISS", True)


async def test_a_client_that_pipelines_hundreds_of_hits_gets_every_answer_in_order(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 requests written before any answer is read (19 MiB of answers): aiohttp stops
    reading a connection whose queue holds 32 parsed requests; the requests answered at
    once must let it read on (they did not, and the client waited forever at the 33rd),
    and the socket fills, so the answers after that wait their turn, in order."""
    objects = {f"s{i}": os.urandom(64 * 1024) for i in range(4)}
    for key, data in objects.items():
        await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key=key, Body=data)
    sends = _spy_sends(monkeypatch)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        urls = {key: presigned_get(node.url, bucket, key) for key in objects}
        conn = await Connection.open(node.url)
        try:
            for url in urls.values():
                await _until_hit(conn, url)
            sends.clear()
            keys = [f"s{i % 4}" for i in range(300)]
            conn.send(*(request(urls[key]) for key in keys))
            await asyncio.sleep(0.5)
            for n, key in enumerate(keys):
                status, _, body = await conn.reply()
                assert (status, body == objects[key]) == (200, True), (n, key)
        finally:
            conn.close()
    # Sent from the page cache while the socket took them; cut short where it filled up
    # (the rest written from the file's bytes); then through the transport's buffer.
    if zerocopy.AVAILABLE:
        assert sends and any(sent < whole for sent, whole in sends)
        assert len(sends) < len(keys)
    else:
        assert sends == []


async def test_over_tls_hits_are_answered_at_once_too(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sends = _spy_sends(monkeypatch)  # never on the socket itself under TLS
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    data = os.urandom(64 * 1024)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="t", Body=data)
    tls = ssl.create_default_context(cafile=str(cert))
    tls.check_hostname = False
    async with _node(
        origin, credentials_file, tmp_path / "cache", tls_cert=str(cert), tls_key=str(key)
    ) as node:
        url = presigned_get(node.url.replace("http://", "https://"), bucket, "t")
        conn = await Connection.open(url, tls)
        try:
            await _until_hit(conn, url)
            answered.clear()
            for _ in range(20):
                status, headers, body = await conn.get(request(url))
                assert (status, dict(headers)["x-lota-cache"], body == data) == (200, "HIT", True)
        finally:
            conn.close()
    assert answered == [True] * 20
    assert sends == []


async def test_hits_answered_at_once_leave_no_cyclic_garbage(
    origin: str, origin_s3: Any, bucket: str, credentials_file: Path, tmp_path: Path
) -> None:
    """What a hit answered at once allocates is freed as it goes, none of it in reference
    cycles (nor is the test client's): a serving process may run Python's cycle collector
    rarely (lota.node.serve.collect_less) without holding back the garbage of its hits."""
    keys = [f"k{i}" for i in range(20)]
    for key in keys:
        await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key=key, Body=b"x" * 5000)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        urls = [presigned_get(node.url, bucket, key) for key in keys]
        conn = await Connection.open(node.url)
        try:
            for url in urls:
                await _until_hit(conn, url)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for url in urls * 10:  # first answers at once, then remembered ones
                    assert (await conn.get(request(url)))[0] == 200
                await asyncio.sleep(0.1)
                gc.collect()
                ours = [type(o).__qualname__ for o in gc.garbage]  # the client's too
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
        finally:
            conn.close()
    assert ours == []


async def test_a_request_that_came_whole_is_answered_again_from_its_bytes_alone(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit that came in one read, the parser between requests before and after it, is
    answered again from those bytes alone, before any parsing, with the answer parsing
    gives. Bytes that were not a whole request from a boundary (the end of a request
    that came in two reads; a body sent after its head) are never answered from them."""
    body = os.urandom(5000)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=body)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        whole = request(url)
        conn, other = await Connection.open(node.url), await Connection.open(node.url)
        try:
            parsed = await _until_hit(conn, url)
            offers.clear()
            replies = [await conn.get(whole) for _ in range(3)] + [await other.get(whole)]
            assert [o.reply is not None for o in offers if o.how == "again"] == [True] * 4
            assert all(_without_date(r) == _without_date(parsed) for r in replies)
            assert parsed[2] == body
            # The same request in two reads: answered, and its second part is no request.
            cut = whole.index(b"\r\nhost:") + 2
            conn.send(whole[:cut])
            await asyncio.sleep(0.1)
            assert (await conn.get(whole[cut:]))[2] == body
            assert (await other.get(whole[cut:]))[0] == 400
            # A PUT's body shaped like the request: a body, stored as sent.
            put = _presigned(node.url, bucket, "p", "put_object")
            third = await Connection.open(node.url)
            try:
                third.send(request(put, "PUT", content_length=str(len(whole))))
                await asyncio.sleep(0.1)
                status, _, _ = await third.get(whole, "PUT")
                assert status == 200
            finally:
                third.close()
            stored = await asyncio.to_thread(origin_s3.get_object, Bucket=bucket, Key="p")
            assert stored["Body"].read() == whole
        finally:
            conn.close()
            other.close()


async def test_a_connection_answered_from_its_bytes_keeps_its_turn_to_give_way(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past max_connections, a new connection closes the one that has waited longest for a
    request head. A connection whose hit was answered from its bytes never left the
    server's list of waiting connections, but waits only since then: it is not the one."""
    body = os.urandom(5000)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=body)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _node(origin, credentials_file, tmp_path / "cache", max_connections="3") as node:
        url = presigned_get(node.url, bucket, "k")
        used = await Connection.open(node.url)
        opened = [used]
        try:
            await _until_hit(used, url)
            idle = await Connection.open(node.url)
            opened.append(idle)
            await asyncio.sleep(0.1)  # accepted: waiting since now
            offers.clear()
            assert (await used.get(request(url)))[2] == body
            assert [(o.how, o.reply is not None) for o in offers] == [("again", True)]
            opened.append(await Connection.open(node.url))
            await asyncio.sleep(0.1)
            opened.append(await Connection.open(node.url))  # one too many: `idle` gives way
            assert await asyncio.wait_for(idle.reader.read(), 5) == b""
            assert (await used.get(request(url)))[2] == body
        finally:
            for conn in opened:
                conn.close()


async def test_a_miss_the_front_end_answered_is_answered_from_its_bytes_the_next_time(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GET the front end answered (a miss, filled) is remembered as an answer at once
    is: the next time it comes, once its bytes are in, it is answered from them before
    any parsing, with the answer parsing gives. One refused is not remembered."""
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        forged = _forged(one.url)
        conn, other = one.conn, await Connection.open(one.node.url)
        try:
            missed = await conn.get(one.whole)
            assert dict(missed[1])["x-lota-cache"] == "MISS" and missed[2] == one.body
            assert (await conn.get(forged))[0] == 403
            # Another URL of the object, read until a hit: the fill has committed.
            parsed = await _until_hit(other, _presigned(one.node.url, bucket, "k", expires=60))
            offers.clear()
            assert _without_date(await conn.get(one.whole)) == _without_date(parsed)
            assert (offers[0].how, offers[0].reply is not None) == ("again", True)
            offers.clear()
            assert (await conn.get(forged))[0] == 403
            assert [(o.how, o.reply) for o in offers] == [("again", None), ("answer", None)]
        finally:
            other.close()


def _spy_told(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[AtOnce]]:
    """What every AtOnce made from here on tells the node's other workers, and each
    AtOnce made."""
    told: list[dict[str, Any]] = []
    made: list[AtOnce] = []
    init = AtOnce.__init__

    def spy_init(self: AtOnce, **parts: Any) -> None:
        init(self, **parts)
        self._tell = told.append
        made.append(self)

    monkeypatch.setattr(AtOnce, "__init__", spy_init)
    return told, made


async def test_a_request_whose_bytes_are_not_at_hand_stays_remembered_and_is_told_once(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a remembered request's bytes are not at hand (out of the page cache), it is
    answered once they are read on a thread, and stays remembered: the other workers are
    told of it once, not at every read; once its bytes are back, it is answered from its
    bytes again."""
    told, _ = _spy_told(monkeypatch)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole = one.conn, one.whole
        parsed = await _until_hit(conn, one.url)
        assert len(told) == 1
        pages = PagesGone(monkeypatch)
        for _ in range(5):
            pages.gone = True
            offers.clear()
            assert _without_date(await conn.get(whole)) == _without_date(parsed)
            assert [(o.how, type(o.reply).__name__) for o in offers] == [
                ("again", "NoneType"),  # not at hand: parsed, then brought to hand
                ("answer", "Reading"),
                ("answer", "tuple"),  # answered at once then
            ]
        assert len(told) == 1
        offers.clear()
        assert _without_date(await conn.get(whole)) == _without_date(parsed)
        assert (offers[0].how, offers[0].reply is not None) == ("again", True)


async def test_hits_whose_bytes_are_not_at_hand_wait_in_order_and_what_is_gone_is_fetched(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answered: list[bool],
) -> None:
    """Pipelined hits whose bytes are not at hand each wait while theirs are read, and are
    answered at once then, in order, the requests behind them too. A chunk found damaged
    by that read is fetched again by the front end, and its client gets the whole body."""
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole, body = one.conn, one.whole, one.body
        await _until_hit(conn, one.url)
        pages = PagesGone(monkeypatch)
        ranged = request(one.url, range="bytes=100-4195")
        answered.clear()
        conn.send(whole, ranged, whole, ranged)
        replies = [await conn.reply() for _ in range(4)]
        assert [(status, got) for status, _, got in replies] == [
            (200, body),
            (206, body[100:4196]),
            (200, body),
            (206, body[100:4196]),
        ]
        assert answered == [True] * 4
        [chunk] = [
            p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size == 5000
        ]
        os.truncate(chunk, 4000)
        pages.gone = True
        answered.clear()
        status, headers, got = await conn.get(whole)
        assert (status, dict(headers)["x-lota-cache"], got) == (200, "MISS", body)
        assert answered == [False]
        assert (await conn.get(whole))[2] == body


async def test_where_every_read_checks_its_chunk_no_hit_waits_for_its_bytes(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``verify = "always"`` a chunk is checked on a thread at every read, so bytes
    brought to hand would still not be answered at once: the front end answers at once,
    with no wait and no read before it."""
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"v" * 5000)
    async with _node(
        origin, credentials_file, tmp_path / "cache", **{"cache.verify": "always"}
    ) as node:
        url = presigned_get(node.url, bucket, "k")
        conn = await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            offers.clear()
            status, headers, got = await conn.get(request(url))
        finally:
            conn.close()
    assert (status, dict(headers)["x-lota-cache"], got) == (200, "HIT", b"v" * 5000)
    assert [type(o.reply).__name__ for o in offers] == ["NoneType"] * len(offers)


async def test_a_hit_told_to_wait_but_taken_by_the_front_end_is_read_and_counted_once(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request can wait (Later) only while aiohttp's task is asleep; otherwise the
    front end answers it at once, and the read begun for it is dropped before it runs:
    the bytes the cache counts as sent are those the client got."""
    sent = r'lota_cache_bytes_total\{source="hit"\}'
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole, body = one.conn, one.whole, one.body
        await _until_hit(conn, one.url)
        monkeypatch.setattr(Deliverer, "read_now", lambda *args, **kwargs: None)
        monkeypatch.setattr(listener, "idle_waiter", lambda handler: None)
        before = _metric(await one.node.metrics(), sent)
        for _ in range(3):
            assert (await conn.get(whole))[2] == body
        await asyncio.sleep(0.1)  # a read left running would be done by now
        assert _metric(await one.node.metrics(), sent) - before == 3 * len(body)


async def test_a_client_that_leaves_while_its_bytes_are_brought_to_hand_is_not_counted(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit waiting for its bytes whose client goes away: nothing is counted as sent or
    answered, the request is no longer in flight, and the next client is answered."""
    sent = r'lota_cache_bytes_total\{source="hit"\}'
    answered = r'lota_requests_total\{operation="GetObject",status="200"\}'
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole, body = one.conn, one.whole, one.body
        await _until_hit(conn, one.url)
        before = await one.node.metrics()
        started, release, brought = asyncio.Event(), asyncio.Event(), asyncio.Event()
        bring = Deliverer.bring_to_hand

        async def slow(*args: Any) -> bool:
            started.set()
            await release.wait()
            try:
                return await bring(*args)
            finally:
                brought.set()

        monkeypatch.setattr(Deliverer, "read_now", lambda *args, **kwargs: None)
        monkeypatch.setattr(Deliverer, "bring_to_hand", slow)
        conn.send(whole)
        await asyncio.wait_for(started.wait(), 10)
        idle = _metric(before, "lota_inflight_requests")  # the scrape's own
        assert _metric(await one.node.metrics(), "lota_inflight_requests") == idle + 1
        conn.close()
        await asyncio.sleep(0.2)  # the node sees the connection go
        release.set()
        await asyncio.wait_for(brought.wait(), 10)
        for _ in range(100):  # the request's end runs as the read's callback
            after = await one.node.metrics()
            if _metric(after, "lota_inflight_requests") == idle:
                break
            await asyncio.sleep(0.01)
        assert _metric(after, "lota_inflight_requests") == idle
        for counted in (sent, answered):
            assert _metric(after, counted) == _metric(before, counted)
        fresh = await Connection.open(one.node.url)
        try:
            assert (await fresh.get(whole))[2] == body
        finally:
            fresh.close()
        assert _metric(await one.node.metrics(), sent) == _metric(before, sent) + len(body)


async def test_a_remembered_answer_is_planned_again_once_its_entry_is_refreshed(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry refreshed in place (the same object, to be checked with the origin before
    its next use, as CacheStore.admit leaves it when its metadata may predate a write)
    stops a remembered answer: the next read is checked with the origin, not answered
    from its bytes (and is forgotten as soon as it is offered again); then it is
    remembered and answered from them again."""
    _, made = _spy_told(monkeypatch)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    unchanged = r'lota_cache_revalidations_total\{result="unchanged"\}'
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole, body = one.conn, one.whole, one.body
        await _until_hit(conn, one.url)
        [at_once] = made
        cache = at_once._plan_hit.__self__.cache  # type: ignore[attr-defined]
        entry = cache.lookup(bucket, "k")
        await cache.admit(replace(entry.meta, validated_at=0.0))
        assert whole in at_once._remembered._entries
        assert at_once.again(whole, None) is None
        assert whole not in at_once._remembered._entries
        checked = _metric(await one.node.metrics(), unchanged)
        offers.clear()
        assert (await conn.get(whole))[2] == body
        assert (offers[0].how, offers[0].reply) == ("again", None)
        after = _metric(await one.node.metrics(), unchanged)
        assert after == checked + 1
        offers.clear()
        assert (await conn.get(whole))[2] == body
        assert (offers[0].how, offers[0].reply is not None) == ("again", True)


async def test_a_request_answered_the_usual_way_is_learnt_only_under_its_own_bytes(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
) -> None:
    """A forged request declined (403) and then a good one the connection never offered
    (``Connection: close``, answered by aiohttp's task): what the good one is learnt as is
    never the forged one's bytes, which stay refused on any connection."""
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        forged = _forged(one.url)
        await _until_hit(one.conn, one.url)
        assert (await one.conn.get(forged))[0] == 403
        status, _, got = await one.conn.get(request(one.url, connection="close"))
        assert (status, got) == (200, one.body)
        for _ in range(2):
            fresh = await Connection.open(one.node.url)
            try:
                assert (await fresh.get(forged))[0] == 403
            finally:
                fresh.close()


async def test_a_request_another_worker_remembered_is_answered_from_its_bytes_unverified(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request remembered by its bytes is told to the node's other workers; one
    told (AtOnce.heard) answers it from its bytes the first time it comes, its verdict
    taken as given (nothing verifies it again), while the verdict's window is open. What
    is told malformed is refused."""
    told, made = _spy_told(monkeypatch)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _one_object(origin, origin_s3, bucket, credentials_file, tmp_path) as one:
        conn, whole = one.conn, one.whole
        parsed = await _until_hit(conn, one.url)
        assert [item["raw"].encode("latin-1") for item in told] == [whole]
        # This worker as one that was only told: nothing remembered, nothing verified.
        [at_once] = made
        at_once._remembered = SizedLru(MAX_CHARS)
        authenticate = Authenticator.authenticate
        monkeypatch.setattr(Authenticator, "authenticate", _never_verified)
        assert at_once.heard(told[0])
        offers.clear()
        assert _without_date(await conn.get(whole)) == _without_date(parsed)
        assert (offers[0].how, offers[0].reply is not None) == ("again", True)
        assert [at_once.heard(bad) for bad in ({"raw": "x"}, {**told[0], "valid": 5})] == [
            False,
            False,
        ]
        # Told a verdict whose window has closed: answered the usual way, verified.
        at_once._remembered = SizedLru(MAX_CHARS)
        assert at_once.heard({**told[0], "valid": [0, 1]})
        monkeypatch.setattr(Authenticator, "authenticate", authenticate)
        offers.clear()
        assert _without_date(await conn.get(whole)) == _without_date(parsed)
        assert offers[0].how == "again" and offers[0].reply is None


def _never_verified(*args: Any) -> None:
    raise AssertionError("verified, not taken as told")


async def test_body_bytes_shaped_like_a_remembered_request_are_never_answered(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GET with a body is answered without its body being read; the body's bytes then
    come in two reads of one callback (as uvloop delivers a full buffer), the first
    ending as a head does, the second the bytes of a request answered before. They are
    a body: nothing answers them (they were answered from memory, a response more than
    the client asked for, and the connection out of step)."""
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"z" * 5000)
    first = b"x" * 10 + b"\r\n\r\n"
    received = S3RequestHandler.data_received

    def two_reads(self: S3RequestHandler, data: bytes) -> None:
        if data.startswith(first) and len(data) > len(first):
            received(self, first)
            received(self, data[len(first) :])
        else:
            received(self, data)

    monkeypatch.setattr(S3RequestHandler, "data_received", two_reads)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        whole = request(url)
        conn, other = await Connection.open(node.url), await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            assert (await conn.get(whole))[2] == b"z" * 5000  # remembered by its bytes
            length = len(first) + len(whole) + 100
            assert (await other.get(request(url, content_length=str(length))))[0] == 200
            other.send(first + whole)  # the body, but for its last 100 bytes
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(other.reply(), 1)
        finally:
            conn.close()
            other.close()


async def test_a_draining_node_answers_no_request_from_memory(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a drain begins, a request answered before, bytes for bytes, gets the drain's
    503 like any other, not its remembered answer."""
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"d" * 5000)
    offered: list[Offer] = []
    _spy_offers(monkeypatch, offered.append)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        whole = request(url)
        conn = await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            assert (await conn.get(whole))[2] == b"d" * 5000
            drain = offered[-1].at_once._drain
            drain.draining = True
            try:
                assert (await conn.get(whole))[0] == 503
            finally:
                drain.draining = False
        finally:
            conn.close()


async def test_requests_signed_in_a_header_are_answered_at_once_but_not_remembered(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """boto3 signs every GET afresh: such hits are answered at once all the same, and not
    remembered (none would come again); a presigned URL's are."""
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"y" * 5000)
    offers: list[Offer] = []
    _spy_offers(monkeypatch, offers.append)
    async with _node(origin, credentials_file, tmp_path / "cache") as node:
        url = presigned_get(node.url, bucket, "k")
        conn = await Connection.open(node.url)
        try:
            await _until_hit(conn, url)
            s3 = client_for(node.url)
            offers.clear()
            for _ in range(5):
                got = await asyncio.to_thread(s3.get_object, Bucket=bucket, Key="k")
                assert got["Body"].read() == b"y" * 5000
            parsed = [o for o in offers if o.how == "answer"]
            at_once = parsed[0].at_once
            assert [o.reply is not None for o in parsed] == [True] * 5
            remembered = len(at_once._remembered)
            assert await conn.get(request(url)) is not None  # the presigned URL again
        finally:
            conn.close()
    assert (remembered, len(at_once._remembered)) == (1, 1)


async def test_with_a_catalog_hits_are_answered_at_once_until_a_write_is_pending(
    origin: str,
    origin_s3: Any,
    bucket: str,
    credentials_file: Path,
    tmp_path: Path,
    answered: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each hit waits for the mirror of pending keys, is recorded as an access, and a
    delete committed elsewhere (pending: its key reads 404 everywhere) is never answered
    with the cached bytes."""
    recorded: list[tuple[str, str]] = []
    original = AccessRecorder.record

    def spy(self: AccessRecorder, bucket: str, key: str, at: float | None = None) -> None:
        recorded.append((bucket, key))
        original(self, bucket, key, at)

    monkeypatch.setattr(AccessRecorder, "record", spy)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"v1" * 1000)
    url_of_catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    more = {"catalog.url": url_of_catalog}
    async with _node(origin, credentials_file, tmp_path / "cache", **more) as node:
        url = presigned_get(node.url, bucket, "k")
        conn = await Connection.open(node.url)
        other = await open_catalog(url_of_catalog, clock=FakeClock(), node="elsewhere")
        try:
            await _until_hit(conn, url)
            answered.clear()
            recorded.clear()
            replies = [await conn.get(request(url)) for _ in range(3)]
            assert [r[0] for r in replies] == [200] * 3 and answered == [True] * 3
            assert replies[2][2] == b"v1" * 1000
            assert recorded == [(bucket, "k")] * 3

            # Pipelined, in one write: they wait together for one refresh, and are
            # answered in order.
            waits: list[int] = []
            real_later = PendingKeys.later
            with monkeypatch.context() as patched:
                patched.setattr(PendingKeys, "later", lambda m: waits.append(1) or real_later(m))
                conn.send(
                    request(url, range="bytes=0-1") + request(url, range="bytes=2-5") + request(url)
                )
                got = [await conn.reply() for _ in range(3)]
            assert [(r[0], r[2]) for r in got] == [
                (206, b"v1"),
                (206, b"v1v1"),
                (200, b"v1" * 1000),
            ]
            assert len(waits) == 1

            # A client that leaves while its request waits: its connection's task ends
            # (aiohttp's sleeps on a future held meanwhile), nothing stays in flight.
            others = _connection_tasks()
            gone = await Connection.open(node.url)
            assert (await gone.get(request(url)))[0] == 200
            await asyncio.sleep(0.1)  # its task, done with that one, sleeps till the next
            [task] = _connection_tasks() - others  # held here: its end is seen, not its loss
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            with monkeypatch.context() as patched:
                patched.setattr(PendingKeys, "later", lambda self: gate)
                gone.send(request(url))
                await _until(node, lambda: not task.done(), in_flight=1)
                gone.close()
                await asyncio.sleep(0.1)
                gate.set_result(None)
            await _until(node, task.done, in_flight=0)

            await other.commit_delete(bucket, "k")
            answered.clear()
            status, _, body = await conn.get(request(url))
            assert status == 404 and b"NoSuchKey" in body
            assert answered == [False]
        finally:
            conn.close()
            await other.close()


def _connection_tasks() -> set[asyncio.Task[Any]]:
    """aiohttp's tasks serving a connection each, in this process."""
    return {t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "RequestHandler.start"}


async def _until(node: InProcessNode, done: Callable[[], bool], *, in_flight: int) -> None:
    """Until `done`, and this many requests in flight (the scrape that asks not counted)."""
    for _ in range(200):
        counted = _metric(await node.metrics(), "lota_inflight_requests") - 1
        if done() and counted == in_flight:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not yet, and {counted} in flight")
