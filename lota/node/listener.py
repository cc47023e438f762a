"""The listening side: aiohttp's low-level server, with its own errors answered as S3 XML.

The low-level :class:`aiohttp.web.Server` (no ``web.Application``, no router, no
middlewares) is a measured choice: it keeps the hit path's per-request work small
(``python -m bench.latency``). Errors in aiohttp's HTTP parser reach the client as S3 XML
(:class:`S3RequestHandler`); each response's bytes are counted by a
:class:`lota.http.BodyWriter`.
"""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import LineTooLong
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from lota.aiohttp_internals import handler_kwargs, server_loop
from lota.config import Config
from lota.connections import GuardedRequestHandler, GuardedServer
from lota.errors import StartupError
from lota.http import BodyWriter
from lota.node.errors import error_response
from lota.node.requests import next_request_id
from lota.s3.errors import S3Error

# aiohttp refuses longer request lines (8 KiB by default) before LOTA sees them; keys over
# S3's 1,024 bytes, percent-encoded, must reach the KeyTooLongError check. Each header
# line keeps aiohttp's 8 KiB bound, at most 128 of them.
MAX_REQUEST_LINE = 64 * 1024


class S3RequestHandler(GuardedRequestHandler):
    """aiohttp's connection handler, with its HTTP-level errors answered as S3 XML."""

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
        # In place of the writer aiohttp made: this one keeps count of what went out.
        loop = server_loop(self)
        counted = BodyWriter(protocol, loop)
        return web.BaseRequest(message, payload, protocol, counted, task, loop)


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
