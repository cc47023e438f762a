"""The store's file I/O threads, and the file deletions still running on them.

Calls awaited by a caller go through :func:`lota.threads.run_in_thread` (a cancelled caller
waits for the call, and ``on_orphan`` gets what it returned). Deletions run in the
background: :meth:`IOPool.background` schedules one and :meth:`IOPool.drain` waits for all,
which is what ``flush()`` and ``close()`` do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from lota.threads import run_in_thread, submit

log = logging.getLogger("lota.cache")

T = TypeVar("T")


class IOPool:
    """A small pool of threads for the blocking file operations of :mod:`lota.cache.files`."""

    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="lota-cache-io")
        self._pending: set[asyncio.Future[None]] = set()

    async def call(
        self, fn: Callable[..., T], *args: Any, on_orphan: Callable[[T], object] | None = None
    ) -> T:
        """`fn(*args)` on a pool thread. If the caller is cancelled, the call still ends and
        `on_orphan` gets its result (an fd to close, say)."""
        return await run_in_thread(fn, *args, executor=self._executor, on_orphan=on_orphan)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Start `fn(*args)` on a pool thread; await it with :func:`lota.threads.outlast`."""
        return submit(fn, *args, executor=self._executor)

    def background(
        self,
        fn: Callable[..., T],
        *args: Any,
        after: asyncio.Future[Any] | None = None,
        then: Callable[[T | None], None],
    ) -> asyncio.Future[None]:
        """Run `fn` on the pool once `after` is done, then `then(result)` on the loop
        whatever happens to those who await the returned future (drain() waits for it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.add(done)

        def finish(cf: Future[T]) -> None:
            self._pending.discard(done)
            result: T | None = None
            if cf.exception() is not None:
                log.warning("cache file cleanup failed", exc_info=cf.exception())
            else:
                result = cf.result()
            try:
                then(result)
            finally:
                if not done.done():
                    done.set_result(None)

        def start(_: object = None) -> None:
            cf = self._executor.submit(fn, *args)
            cf.add_done_callback(lambda f: loop.call_soon_threadsafe(finish, f))

        if after is not None and not after.done():
            after.add_done_callback(start)
        else:
            start()
        return done

    @property
    def idle(self) -> bool:
        """No background job is running."""
        return not self._pending

    async def wait_running(self) -> None:
        """Wait for the background jobs running now (not for those they schedule)."""
        if self._pending:
            await asyncio.wait(set(self._pending))

    async def drain(self) -> None:
        """Wait for every background job, those they schedule included."""
        while self._pending:
            await asyncio.wait(set(self._pending))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
