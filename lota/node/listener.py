"""The listening side: aiohttp's low-level server, with its own errors answered as S3 XML.

The low-level :class:`aiohttp.web.Server` (no ``web.Application``, no router, no
middlewares) is a measured choice: it keeps the hit path's per-request work small
(``python -m bench.latency``). Errors in aiohttp's HTTP parser reach the client as S3 XML
(:class:`S3RequestHandler`); each response's bytes are counted by a
:class:`lota.http.BodyWriter`.

Answered at once: a request without a body that arrives while its connection has nothing
else in hand is first offered to `at_once`, the server's answers
(:class:`lota.node.at_once.AtOnce`: a small cache hit), which answers it there and then,
as the parser hands it over: its head, then its body sent from the page cache
(:mod:`lota.zerocopy`) when nothing waits to be written before it, else written through
the transport; aiohttp's task, request and response objects cost more than the hit
itself (``python -m bench.nginx``). Whatever `at_once` declines, and everything after it
on that connection, goes the usual way, in order. `at_once` may also answer
:class:`Later`: the request stays first in the queue, aiohttp's task asleep, until the
Later's future is done; then it is offered again.

Answered again: bytes that arrive as one whole request head (the parser between two
requests before and after them) are offered to `at_once` with the request, as `raw`; bytes
that arrive later, with the parser between requests and nothing else in hand, are first
offered to the server's `again`, as they are, before any parsing: the same request
answered once is answered from what `at_once` remembered of it (a loader reading the same
presigned URL, one request per segment, as HTTP clients send them). What `again` declines
is parsed and offered as any other.

Learnt: a GET `at_once` declined that aiohttp's task then answered with a 2xx (a miss,
filled) is offered to the server's `learn` once its response is written, with the bytes
it came in as: a request read once per epoch is answered again from its bytes the next
epoch, not first parsed and answered once more the slow way.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import LineTooLong
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler

from lota import zerocopy
from lota.aiohttp_internals import (
    closing,
    handler_kwargs,
    hold_waiter,
    idle_waiter,
    next_bodiless,
    parser_holding,
    queued_messages,
    release_waiter,
    request_message,
    resume_reading_if_drained,
    server_loop,
    take_message,
)
from lota.config import Config
from lota.connections import GuardedRequestHandler, GuardedServer
from lota.errors import StartupError
from lota.http import BodyWriter
from lota.node.errors import error_response
from lota.node.requests import next_request_id
from lota.s3.errors import S3Error
from lota.zerocopy import FileSpan

# aiohttp refuses longer request lines (8 KiB by default) before LOTA sees them; keys over
# S3's 1,024 bytes, percent-encoded, must reach the KeyTooLongError check. Each header
# line keeps aiohttp's 8 KiB bound, at most 128 of them.
MAX_REQUEST_LINE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Later:
    """`at_once`'s word for a request it can answer only once `ready` is done (a node with
    a catalog first hears of the writes committed before the request came; a hit's bytes
    are read on a thread). The request stays first in its connection's queue, nothing
    after it answered, aiohttp's task kept asleep; then it is offered again, with this,
    and answered or declined as any other.
    `finish` is called once `ready` is done, whatever became of the connection; or at
    once, the request declined instead, when aiohttp's task was not asleep to be held."""

    ready: asyncio.Future[Any]
    finish: Callable[[], None]
    started: float
    """When the request was first offered (its time counts from there)."""


# A response written at once: its head, then its body, as bytes or as a span of a file
# that the page cache holds (sent from there, :mod:`lota.zerocopy`).
Response = tuple[bytes, bytes | bytearray | FileSpan]
# A request answered at once: its response, None to decline, or Later.
Reply = Response | Later | None


class Answers:
    """What a server answers as its connections parse requests (see the module): here,
    nothing (every request answered by aiohttp's task); :class:`lota.node.at_once.AtOnce`
    answers small hits."""

    def answer(
        self,
        message: RawRequestMessage,
        remote: str | None,
        waited: Later | None,
        raw: bytes | None,
        span: bool,
    ) -> Reply:
        """A request just parsed: answered, declined (None) or Later. Offered again after
        a Later, with it (`waited`); `raw`: the bytes it came in as, when they were
        exactly that request; `span`: the connection can send a body that is a span of a
        file (:class:`lota.zerocopy.FileSpan`) now."""
        return None

    def again(self, raw: bytes, remote: str | None, span: bool) -> Response | None:
        """A request answered again from its bytes alone, before parsing; or None."""
        return None

    def learn(self, message: RawRequestMessage, raw: bytes | None) -> None:
        """A GET declined here has been answered by aiohttp's task (2xx): remember it if
        it can be answered here when it comes again. `raw` as for :meth:`answer`."""
        return None


class S3RequestHandler(GuardedRequestHandler):
    """aiohttp's connection handler, with its HTTP-level errors answered as S3 XML and the
    requests its server's `answers` take answered as they are parsed."""

    def __init__(self, manager: S3Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        answers = manager.answers
        self._at_once = answers.answer
        self._again = answers.again
        self._learn = answers.learn
        # The last request `at_once` declined, with the bytes it came in as (or None):
        # learnt once aiohttp's task has answered it.
        self._declined: tuple[RawRequestMessage, bytes | None] | None = None
        self._remote: str | None = None
        # The socket, where a response may be written on it directly: none under TLS.
        self._socket: zerocopy.Borrowed | None = None
        # The parser is between two requests: the next bytes start one.
        self._between = True
        # From when aiohttp's task takes a request off the queue until its response is
        # written: a request answered at once meanwhile would overtake it.
        self.answering = False
        # While requests aiohttp held back are parsed: they are answered by the loop that
        # asked for them, not by a call within it.
        self._resuming = False
        # aiohttp's task's future, held while the first queued request waits for a Later.
        self._held: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        tls = transport.get_extra_info("sslcontext") or transport.get_extra_info("ssl_object")
        if sock is not None and tls is None:
            self._socket = zerocopy.borrow(sock.fileno())

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._socket is not None:
            self._socket.detach()
            self._socket = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._resuming or self.answering or self._queued or self.writing_paused:
            self._between = False  # known again once bytes are parsed with nothing in hand
            super().data_received(data)
            return
        between = self._between
        if between and self._answer_again(data):
            return
        # The task may be asleep, waiting for a request: it stays so unless some are left
        # for it. Or it is between two (a response written): it looks at the queue itself.
        waiter = idle_waiter(self)
        if waiter is not None:
            hold_waiter(self)
        waits = False
        try:
            super().data_received(data)
            # Between requests after `data` only from a known boundary, or if `data` ended
            # a request: bytes of a body can end as a head does.
            self._between = (between or len(self._queued) > 0) and self._whole_heads(data)
            raw = data if between and self._between and len(self._queued) == 1 else None
            waits = self._answer_at_once(waiter, None, 0, raw)
        finally:
            if waiter is not None and not waits:
                release_waiter(self, waiter)

    def _whole_heads(self, data: bytes) -> bool:
        """Whether `data`, just parsed with no request in hand before it, from a boundary
        or bringing a request, left the parser between two requests: it ends a head,
        every request it brought has no body, and the parser held none back."""
        if not data.endswith(b"\r\n\r\n") or parser_holding(self):
            return False
        return all(
            isinstance(message, RawRequestMessage) and payload is EMPTY_PAYLOAD
            for message, payload in queued_messages(self)
        )

    def _answer_again(self, data: bytes) -> bool:
        """Answer `data` from the server's `again`, unparsed (see the module); False if it
        declines (then the bytes are parsed)."""
        transport = self.transport
        if transport is None or closing(self):
            return False
        if self._remote is None:
            self._remote = _remote(self.peername)
        span = self._can_span(transport)
        reply = self._again(data, self._remote, span)
        if reply is None:
            return False
        if self._write(transport, reply, span):
            self.head_answered()
        return True

    def _can_span(self, transport: asyncio.Transport) -> bool:
        """Whether a body that is a span of a file can be sent on this connection now:
        straight on its socket (not under TLS), with nothing waiting to go before it, and
        not closing (a connection being closed takes no more answers)."""
        return (
            self._socket is not None
            and not transport.get_write_buffer_size()
            and not transport.is_closing()
        )

    def _write(self, transport: asyncio.Transport, response: Response, span: bool) -> bool:
        """Write a response answered here: a span of a file straight from the page cache
        when nothing else waits to be written before it (`span`: :meth:`_can_span` when
        the response was asked for, and nothing was written since;
        :func:`lota.zerocopy.send`), else through the transport; once some of it is out
        and the rest cannot be read, the connection is cut (never a short body presented
        as whole): then False."""
        head, body = response
        if not isinstance(body, FileSpan):
            transport.writelines((head, body))
            return True
        sent = 0
        if span:
            assert self._socket is not None
            sent = zerocopy.send(self._socket, head, body)
        skip = sent - len(head)
        if skip == body.count:  # all of it went out: every span but a few
            return True
        if skip < 0:
            transport.write(head[sent:])
            skip = 0
        if skip < body.count:
            rest = body.read(skip)
            if rest is None:
                transport.abort()
                return False
            transport.write(rest)
        return True

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            done = await super().finish_response(request, resp, start_time)
        finally:
            self.answering = False
        declined, self._declined = self._declined, None
        message = request_message(request)
        if message.method == "GET" and 200 <= resp.status < 300:
            raw = declined[1] if declined is not None and declined[0] is message else None
            self._learn(message, raw)
        return done

    def _answer_at_once(
        self,
        waiter: asyncio.Future[None] | None,
        waited: Later | None,
        covered: int,
        raw: bytes | None = None,
    ) -> bool:
        """Answer the queued requests `at_once` takes, from the first; stop at the first it
        declines (it and the rest go to aiohttp's task, in order). When all were taken and
        aiohttp had stopped reading (its queue was full), the requests it held back are
        parsed and answered too. True when the first left waits for a :class:`Later`
        (`waiter`, the task's, stays held until it is offered again); with no `waiter`
        (the task is not asleep: it would take the request meanwhile), declined instead.
        `waited`: the Later the first `covered` requests waited for (they were queued when
        it was made, so before what it waited for began). `raw`: the bytes the first
        request came in as, when they were exactly that request."""
        answered = waits = False
        transport = self.transport
        while transport is not None and not self.writing_paused:
            message = next_bodiless(self)
            if message is None:
                if self._queued or not self._parse_held_back():
                    break
                continue
            if message.should_close:
                break
            if self._remote is None:
                self._remote = _remote(self.peername)
            span = self._can_span(transport)
            reply = self._at_once(message, self._remote, waited, raw, span)
            covered -= 1
            if covered <= 0:
                waited = None
            if reply is None:
                self._declined = (message, raw)
                break
            raw = None
            if isinstance(reply, Later):
                if waiter is None:
                    reply.finish()
                else:
                    waiting = partial(self._waited, waiter, reply, len(self._queued))
                    reply.ready.add_done_callback(waiting)
                    self._held = waiter
                    waits = True
                break
            take_message(self)
            answered = True
            if not self._write(transport, reply, span):
                break
        if answered:
            self.head_answered()
        return waits

    def _waited(self, waiter: asyncio.Future[None], later: Later, covered: int, _: object) -> None:
        """The first queued request's :class:`Later` is done: offer it again (and the
        `covered` requests queued with it); if the connection is gone or closing, end
        aiohttp's task (nothing else would wake it)."""
        self._held = None
        later.finish()
        if waiter.done():
            return  # cancelled by close(): the task has ended
        if self.transport is None:
            waiter.cancel()
            return
        waits = False
        try:
            waits = self._answer_at_once(waiter, later, covered)
        finally:
            if not waits:
                release_waiter(self, waiter)

    def close(self) -> None:
        super().close()
        self._cancel_held()

    def force_close(self) -> None:
        super().force_close()
        self._cancel_held()

    def _cancel_held(self) -> None:
        """aiohttp cancels the future its task sleeps on to end it; while a request waits
        for a :class:`Later`, that future is held here."""
        if self._held is not None and not self._held.done():
            self._held.cancel()

    def _parse_held_back(self) -> bool:
        """Parse requests aiohttp held back while its queue was full; True if any came."""
        self._resuming = True
        try:
            resume_reading_if_drained(self)
        finally:
            self._resuming = False
        return bool(self._queued)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        if status >= 500:
            self.log_exception("error handling request", exc_info=exc)
            err = S3Error("InternalError")
        elif isinstance(exc, LineTooLong):
            err = S3Error(
                "RequestHeaderSectionTooLarge",
                "Your request header section exceeds the maximum allowed size.",
            )
        else:
            err = S3Error("InvalidRequest", f"Malformed HTTP request: {message or exc}"[:512])
        response = error_response(err, next_request_id())
        response.force_close()
        return response


class S3Server(GuardedServer):
    """aiohttp's low-level server using :class:`S3RequestHandler` for each connection, and
    a :class:`BodyWriter` for each response."""

    def __init__(
        self,
        handler: Any,
        *,
        answers: Answers | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.answers = answers or Answers()

    def __call__(self) -> RequestHandler:
        return S3RequestHandler(self, loop=server_loop(self), **handler_kwargs(self))

    def _make_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        # aiohttp's task has just taken this request off the queue.
        if isinstance(protocol, S3RequestHandler):
            protocol.answering = True
        # In place of the writer aiohttp made: this one keeps count of what went out.
        loop = server_loop(self)
        counted = BodyWriter(protocol, loop)
        return web.BaseRequest(message, payload, protocol, counted, task, loop)


def _remote(peername: Any) -> str | None:
    """The client's address, as ``request.remote`` gives it."""
    if peername is None:
        return None
    return str(peername[0]) if isinstance(peername, (list, tuple)) else str(peername)


def ssl_context(config: Config) -> ssl.SSLContext | None:
    """The TLS context `config` asks for (``tls_cert``/``tls_key``); None: plain HTTP."""
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"cannot load tls_cert / tls_key: {exc}") from exc
    return context
