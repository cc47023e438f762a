"""Every background task has an owner: :class:`TaskGroup` keeps a named reference to each
task it starts, logs the ones that fail, and cancels what is left when it closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("lota.tasks")


class TaskGroup:
    """Owns background tasks for the lifetime of a component."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, seconds: float) -> None:
        """Wait up to `seconds` for the tasks to finish on their own."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=seconds)

    async def close(self) -> None:
        """Cancel every task still running and wait until they are gone."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
