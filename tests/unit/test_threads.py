"""The one way to run blocking calls on a thread: what cancelling the caller does."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lota.threads import outlast, run_in_thread, submit


async def test_a_call_returns_its_result_on_the_given_executor() -> None:
    with ThreadPoolExecutor(1, thread_name_prefix="only") as pool:
        name = await run_in_thread(lambda: threading.current_thread().name, executor=pool)
    assert name.startswith("only")


async def test_a_call_raises_its_exception() -> None:
    def fail() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_in_thread(fail)


async def test_a_cancelled_caller_waits_for_the_call_then_is_cancelled() -> None:
    gate, ended = threading.Event(), threading.Event()

    def slow() -> int:
        gate.wait(10)
        ended.set()
        return 7

    got: list[int] = []
    task = asyncio.get_running_loop().create_task(run_in_thread(slow, on_orphan=got.append))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the thread
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended.is_set() and got == [7]


async def test_repeated_cancellation_does_not_cut_the_wait_short() -> None:
    gate = threading.Event()
    got: list[str] = []
    task = asyncio.get_running_loop().create_task(
        run_in_thread(gate.wait, 10, on_orphan=lambda _: got.append("orphan"))
    )
    await asyncio.sleep(0.05)
    for _ in range(3):
        task.cancel()
        await asyncio.sleep(0.02)
    assert not task.done()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == ["orphan"]


async def test_a_queued_call_still_runs_when_its_caller_is_cancelled() -> None:
    gate, ran = threading.Event(), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        blocker = submit(gate.wait, 10, executor=pool)
        task = asyncio.get_running_loop().create_task(run_in_thread(ran.set, executor=pool))
        await asyncio.sleep(0.05)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await blocker
    assert ran.is_set()


async def test_the_exception_of_an_orphaned_call_goes_to_its_handler() -> None:
    gate = threading.Event()

    def fail() -> None:
        gate.wait(10)
        raise OSError("disk gone")

    errors: list[BaseException] = []
    task = asyncio.get_running_loop().create_task(
        outlast(submit(fail), on_orphan_error=errors.append)
    )
    await asyncio.sleep(0.05)
    task.cancel()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [str(e) for e in errors] == ["disk gone"]


async def test_the_exception_of_an_orphaned_call_without_handler_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()

    def fail() -> None:
        gate.wait(10)
        raise OSError("disk gone")

    task = asyncio.get_running_loop().create_task(run_in_thread(fail))
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.ERROR, logger="lota.threads"):
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert any(r.exc_info and "disk gone" in str(r.exc_info[1]) for r in caplog.records)
