"""A bench stopped by SIGTERM (``timeout``, ``kill``) cleans up as after Ctrl-C: its
temporary directory is removed and the servers it started are stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _started_under(path: Path) -> list[int]:
    """Processes whose command line names something under `path`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_a_bench_terminated_leaves_no_directory_and_no_server(tmp_path: Path, when: str) -> None:
    """`when`: as soon as its origin and LOTA node run (the node still starting), or once
    it has timed its first run (the node serving)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = tmp_path / "stdout"
    with out.open("wb") as stdout, (tmp_path / "stderr").open("wb") as stderr:
        bench = subprocess.Popen(
            [sys.executable, "-m", "bench.coldread", "--size", "64MiB", "--runs", "100"],
            env={**os.environ, "TMPDIR": str(temporary)},
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 120
        while len(_started_under(temporary)) < 2 or (
            when == "serving" and "run 0:" not in out.read_text()
        ):
            assert bench.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, f"the bench was not {when} in time"
            time.sleep(0.05)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
        left = _started_under(temporary)
    finally:
        bench.kill()
        bench.wait()
        for pid in _started_under(temporary):  # what a failing bench left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 128 + signal.SIGTERM, (tmp_path / "stderr").read_text()
    assert left == []
    assert list(temporary.iterdir()) == []
