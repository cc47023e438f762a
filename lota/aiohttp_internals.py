"""Every use LOTA makes of aiohttp that is not its documented API, in one place.

LOTA serves on aiohttp's low-level server and reaches below it in a few places, each for a
reason the public API cannot serve. Going through these names keeps the list short and
findable when aiohttp changes:

- :func:`request_queue`: ``RequestHandler._messages``, the request heads a connection
  has parsed and not yet answered; the header timeout (:mod:`lota.connections`) needs to
  know when a head is complete.
- :func:`handler_loop` and :func:`server_loop`: ``RequestHandler._loop`` and
  ``web.Server._loop``, the loop a connection's timers run on.
- :func:`handler_kwargs`: ``web.Server._kwargs``, what ``web.Server.__call__`` passes to
  each ``RequestHandler``, so that a subclass can build its own handler class.
- :func:`payload_writer`: ``StreamResponse._payload_writer``, the writer a zero-copy
  response sends its headers through before ``sendfile``.
- :func:`bound_address`: ``TCPSite._server``, the asyncio server, for the port really
  bound when listening on port 0.
- :func:`idle_waiter`, :func:`take_message`, :func:`keep_alive_until`: a connection's
  queue of parsed requests (``RequestHandler._messages``, ``_waiter``, ``_parser``,
  ``_next_keepalive_close_time``), so that a request answerable at once is answered as
  it is parsed, without a task, a request and a response object (lota.node.listener).
- :func:`queued_messages`, :func:`parser_holding`, :func:`closing`: whether the parser
  is between two requests (``_messages``, ``_max_msg_queue_size``, ``_upgraded``,
  ``_close``, ``_force_close``), so that a request seen before is answered from its bytes, unparsed.
- :func:`request_message`: ``BaseRequest._message``, the parsed head a request was made
  of (``BaseRequest.message`` is deprecated), so that a request aiohttp's task answered
  is known as the one the connection offered to be answered at once.
- :func:`http_date`: ``aiohttp.helpers.rfc822_formatted_time``, the Date header aiohttp
  writes (formatted once a second), for responses written without it.
- :func:`extend_read_timeout`: ``ResponseHandler.read_timeout`` and ``start_timeout()``
  of a client connection: a response whose head came in time gets a longer wait between
  body bytes (what aiohttp itself does for a websocket after its handshake).

Overridden hooks, outside this module for now: ``RequestHandler.finish_response`` and
``connection_made``/``data_received`` (lota.connections), ``web.Server._make_request``
(lota.node.listener), ``StreamResponse._send_headers_immediately = False`` (lota.cache.reads).

pyproject.toml pins ``aiohttp>=3.12``: 3.12.0 is the first release with
``StreamResponse._send_headers_immediately`` and ``StreamWriter.send_headers()`` (aiohttp
PR #10991, headers and a small body coalesced into one send); everything else above is
older. Check this list against aiohttp's source before raising or lifting the pin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler


def request_queue(handler: RequestHandler) -> Sized:
    """The parsed request heads that wait on this connection to be answered: its length is
    how many. aiohttp makes the queue once per connection, so it may be kept (its length
    is read for every request)."""
    queue: Sized = handler._messages
    return queue


def request_message(request: web.BaseRequest) -> RawRequestMessage:
    """The parsed head `request` was made of."""
    message: RawRequestMessage = request._message
    return message


def queued_messages(handler: RequestHandler) -> list[tuple[Any, Any]]:
    """The parsed request heads waiting on this connection, each with its body's reader."""
    return list(handler._messages)


def parser_holding(handler: RequestHandler) -> bool:
    """Whether the parser may hold bytes back: the connection was upgraded, or its queue
    is full (aiohttp >= 3.14 stops parsing once it holds ``_max_msg_queue_size``)."""
    limit = getattr(handler, "_max_msg_queue_size", 0)
    return handler._upgraded or (bool(limit) and len(handler._messages) >= limit)


def closing(handler: RequestHandler) -> bool:
    """Whether the connection is closing (aiohttp then parses nothing more of it)."""
    return bool(handler._force_close or handler._close)


def idle_waiter(handler: RequestHandler) -> asyncio.Future[None] | None:
    """The future the connection's task waits on for its next request, if it waits."""
    waiter = handler._waiter
    return None if waiter is None or waiter.done() else waiter


def hold_waiter(handler: RequestHandler) -> None:
    """Keep the connection's task asleep while requests are parsed (see :func:`idle_waiter`):
    :func:`release_waiter` wakes it if any are left for it."""
    handler._waiter = None


def release_waiter(handler: RequestHandler, waiter: asyncio.Future[None]) -> None:
    handler._waiter = waiter
    if handler._messages:
        waiter.set_result(None)


def next_bodiless(handler: RequestHandler) -> RawRequestMessage | None:
    """The first queued request if it is a well-formed one without a body."""
    if not handler._messages:
        return None
    message, payload = handler._messages[0]
    if payload is not EMPTY_PAYLOAD or not isinstance(message, RawRequestMessage):
        return None
    return message


def take_message(handler: RequestHandler) -> None:
    """Take the first queued request off the queue: it has been answered."""
    handler._messages.popleft()
    consumed = getattr(handler._parser, "message_consumed", None)  # aiohttp >= 3.13.3
    if consumed is not None:
        consumed()


def resume_reading_if_drained(handler: RequestHandler) -> None:
    """aiohttp (3.14) stops reading a connection once 32 parsed requests wait in its queue,
    and reads again as its task takes them; requests taken at once must do the same, or a
    client that pipelines more than that waits forever. Parses what it held back."""
    paused = getattr(handler, "_buffer_paused", False)
    if paused and len(handler._messages) <= getattr(handler, "_msg_queue_resume_size", 0):
        handler._resume_reading_if_drained()


def keep_alive_until(handler: RequestHandler, when: float) -> None:
    """aiohttp's own keep-alive timer must not close a connection that was just used."""
    handler._next_keepalive_close_time = when


def http_date() -> str:
    """Now, as the Date header of a response."""
    return rfc822_formatted_time()


def handler_loop(handler: RequestHandler) -> asyncio.AbstractEventLoop:
    return handler._loop


def server_loop(server: web.Server) -> asyncio.AbstractEventLoop:
    return server._loop


def handler_kwargs(server: web.Server) -> dict[str, Any]:
    """The keyword arguments `server` gives each connection's ``RequestHandler``."""
    return server._kwargs


def payload_writer(response: web.StreamResponse) -> AbstractStreamWriter | None:
    """The writer of a prepared response (``None`` before ``prepare``)."""
    return response._payload_writer


def bound_address(site: web.TCPSite | web.SockSite) -> tuple[str, int]:
    """The host and port a started site listens on (the real port when asked for port 0)."""
    server: Any = site._server  # asyncio's or uvloop's Server: both have .sockets
    host, port = server.sockets[0].getsockname()[:2]
    return host, port


def extend_read_timeout(response: Any, seconds: float | None) -> None:
    """The head of client `response` is in: give its body `seconds` between bytes."""
    connection = response.connection  # None once the whole body is in
    if connection is None or connection.protocol is None:
        return
    connection.protocol.read_timeout = seconds
    # The timer armed by the last read still has the short wait: restart it. While
    # reading is paused (the consumer is behind) there is none; resuming arms the new one.
    transport = connection.transport
    if transport is not None and transport.is_reading():
        connection.protocol.start_timeout()
