"""The one clock every LOTA component reads, so time can be shifted or faked.

``LOTA_TIME_OFFSET`` (``"30d"``, ``"-2h"``, seconds) shifts the clock of a whole ``lota``
process, which lets a 90-day lifecycle scenario run in seconds; tests pass a
:class:`FakeClock` instead. Access times, revalidation ages and lifecycle decisions follow
it; SigV4 signatures (checked and made) always use the real time.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from lota.settings import parse_duration


class Clock:
    """Wall-clock time in seconds since the epoch. Its ``time`` is :func:`time.time` itself,
    bound at import (read on every hit, it adds no Python call; patching ``time.time``
    later does not reach it: tests pass a :class:`FakeClock`)."""

    time = staticmethod(time.time)

    @classmethod
    def from_environment(cls) -> Clock:
        raw = os.environ.get("LOTA_TIME_OFFSET", "").strip()
        if not raw:
            return Clock()
        sign = -1.0 if raw.startswith("-") else 1.0
        return ShiftedClock(sign * parse_duration(raw.lstrip("+-")))

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), UTC)


class ShiftedClock(Clock):
    """Wall-clock time shifted by a fixed offset (``LOTA_TIME_OFFSET``)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset


class FakeClock(Clock):
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        super().__init__()
        self._now = start

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
