"""Blocking calls on a thread, awaited in a way that survives cancellation.

Use :func:`run_in_thread` for every blocking call whose outcome matters after its caller
is gone: a descriptor it opens, a file it writes, a commit it makes::

    fd = await run_in_thread(os.open, path, flags, on_orphan=os.close)
    await run_in_thread(conn.commit, executor=self._thread)  # one dedicated thread

What cancelling the awaiting task does:

- The call is not cancelled: once submitted it runs to its end, even if it was still
  waiting for a free thread. A thread cannot be interrupted anyway, and a call that owns a
  descriptor (a write, an fsync, a rename) must not have it closed under it.
- The caller waits for that end before the cancellation goes on. So the caller's cleanup
  (closing the descriptor the call writes to, deleting its file) runs after the call,
  never beside it. Further cancellations while it waits do not cut the wait short.
- The outcome is consumed, on the event loop: a result goes to ``on_orphan`` (to close or
  delete what the caller will never use), an exception to ``on_orphan_error`` (logged if
  none is given). Nothing is left unretrieved.
- Then ``CancelledError`` propagates, as always.

:func:`submit` starts a call without awaiting it (to overlap it with other work); await
its future with :func:`outlast` to get the same guarantees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

log = logging.getLogger("lota.threads")

T = TypeVar("T")


def submit(fn: Callable[..., T], *args: Any, executor: Executor | None = None) -> asyncio.Future[T]:
    """Start `fn(*args)` on `executor` (None: the loop's default pool) and return its future."""
    return asyncio.get_running_loop().run_in_executor(executor, fn, *args)


async def run_in_thread(
    fn: Callable[..., T],
    *args: Any,
    executor: Executor | None = None,
    on_orphan: Callable[[T], object] | None = None,
    on_orphan_error: Callable[[BaseException], object] | None = None,
) -> T:
    """`fn(*args)` on `executor` (None: the loop's default pool). See the module docstring
    for what cancelling the caller does."""
    future = submit(fn, *args, executor=executor)
    return await outlast(future, on_orphan=on_orphan, on_orphan_error=on_orphan_error)


async def outlast(
    future: asyncio.Future[T],
    *,
    on_orphan: Callable[[T], object] | None = None,
    on_orphan_error: Callable[[BaseException], object] | None = None,
) -> T:
    """Await `future` (of a call on a thread); if the caller is cancelled, wait for the call
    to end and hand its outcome to `on_orphan` or `on_orphan_error` before re-raising."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        _orphaned(future, on_orphan, on_orphan_error)
        raise


def _orphaned(
    future: asyncio.Future[T],
    on_orphan: Callable[[T], object] | None,
    on_orphan_error: Callable[[BaseException], object] | None,
) -> None:
    if future.cancelled():  # the executor was shut down before the call started
        return
    exc = future.exception()
    if exc is None:
        if on_orphan is not None:
            on_orphan(future.result())
    elif on_orphan_error is not None:
        on_orphan_error(exc)
    else:
        log.error("a call whose caller was cancelled failed", exc_info=exc)
