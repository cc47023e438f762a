"""Every background task has an owner: :class:`TaskGroup` keeps a named reference to each
task it starts, logs the ones that fail, and cancels what is left when it closes.

This is the one place in ``lota/`` that creates tasks: ruff bans ``asyncio.create_task`` and
``asyncio.ensure_future`` elsewhere (``TID251``, configured in ``pyproject.toml``), and
``tests/unit/test_tasks.py`` catches ``loop.create_task(...)``, which ruff cannot see. Work
whose tasks all end within one ``await`` may use :class:`asyncio.TaskGroup` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("lota.tasks")


class TaskGroup:
    """Owns background tasks for the lifetime of a component."""

    def __init__(self, name: str, *, log_failures: bool = True) -> None:
        """`log_failures` off: the owner awaits its tasks and handles their errors itself."""
        self.name = name
        self._log_failures = log_failures
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if self._log_failures and not task.cancelled() and task.exception() is not None:
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
