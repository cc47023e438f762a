"""lota.node.serve.schedule: the serving process's threads under SCHED_BATCH, or as they
were started. Each case runs in a process of its own, which first puts itself under the
policy the case gives (whatever the test runner's own, but for SCHED_IDLE, which only a
privileged runner leaves): a policy set is the process's for good."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from lota.node import serve

# Starts a thread, applies the policy given, then starts another; prints the policies of
# the main thread, the thread started before and the one started after.
PROBE = """
import os, sys, threading
os.sched_setscheduler(0, int(sys.argv[2]), os.sched_param(0))
from lota.node.serve import schedule
ready, done = threading.Event(), threading.Event()
before = threading.Thread(target=lambda: (ready.set(), done.wait()))
before.start(); ready.wait()
schedule(sys.argv[1])
after = []
later = threading.Thread(target=lambda: after.append(os.sched_getscheduler(0)))
later.start(); later.join()
print(os.sched_getscheduler(0), os.sched_getscheduler(before.native_id), after[0])
done.set()
"""
RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)


def _policies(policy: str, started: int = os.SCHED_OTHER) -> list[int]:
    """The probe's three policies (reset-on-fork flag dropped), started under `started`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, policy, str(started)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [int(word) & ~RESET_ON_FORK for word in done.stdout.split()]


def test_batch_puts_every_thread_under_sched_batch_those_started_later_too() -> None:
    assert _policies("batch") == [os.SCHED_BATCH] * 3


def test_batch_is_applied_to_a_default_policy_that_resets_on_fork() -> None:
    assert _policies("batch", os.SCHED_OTHER | RESET_ON_FORK) == [os.SCHED_BATCH] * 3


def test_normal_leaves_the_policy_as_started() -> None:
    assert _policies("normal") == [os.SCHED_OTHER] * 3
    assert _policies("normal", os.SCHED_BATCH) == [os.SCHED_BATCH] * 3


def test_a_policy_the_operator_chose_stands() -> None:
    assert _policies("batch", os.SCHED_IDLE) == [os.SCHED_IDLE] * 3


def test_a_system_that_refuses_it_gets_a_warning_not_a_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_getscheduler", lambda _: os.SCHED_OTHER)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.WARNING, logger="lota.node.serve"):
        serve.schedule("batch")
    assert "scheduling = batch not applied: [Errno 1] Operation not permitted" in caplog.text


def test_a_system_without_the_policy_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "SCHED_BATCH")
    monkeypatch.setattr(os, "sched_getscheduler", lambda _: os.SCHED_OTHER)
    serve.schedule("batch")  # no AttributeError


def test_the_policy_a_process_runs_under_is_named_without_its_reset_on_fork_flag() -> None:
    code = "import os, sys; sys.stdin.read()"
    for started, name in (
        (os.SCHED_IDLE, "SCHED_IDLE"),
        (os.SCHED_OTHER | RESET_ON_FORK, "SCHED_OTHER"),
    ):
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        try:
            os.sched_setscheduler(child.pid, started, os.sched_param(0))
            assert serve.policy_of(child.pid) == name
        finally:
            child.communicate(b"", timeout=60)
