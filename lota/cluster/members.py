"""Who is in the cluster, who may be asked now, and who owns chunks: :class:`Membership`.

The members come from a list (``[cluster] members``, or the records of ``dns`` as last
resolved). What this node has seen of each turns that list into two answers:

- **who owns chunks** (:meth:`Membership.owners`): every listed member and this node, plus
  members missing from the list for less than ``grace``, minus members whose calls have
  failed for ``grace`` or more. Ownership therefore only changes when an absence outlasts
  the grace period: a rolling restart, or a pod that drops out of DNS for a moment,
  reshuffles nothing; a restarted node owns what it owned before, and finds it on its disk.
- **who may be asked now** (:meth:`Membership.usable`): a member whose last call failed is
  skipped (its chunks read from the next owner, then the origin) until its back-off ends,
  1 s doubling to :data:`MAX_BACKOFF`; then one request, or the refresh's probe, tries it
  again, and one answer clears it.

No I/O and no clock of its own: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0


@dataclass(slots=True)
class _Down:
    since: float  # when calls to it started failing
    retry_at: float  # when it may be asked again
    backoff: float


class Membership:
    """This node's view of the cluster's members."""

    def __init__(self, me: str, grace: float) -> None:
        self.me = me
        self.grace = grace
        self.listed: frozenset[str] = frozenset()
        self._absent: dict[str, float] = {}  # listed before, missing now: since when
        self._down: dict[str, _Down] = {}

    def update(self, members: Iterable[str], now: float) -> None:
        """The members as the static list or DNS names them now."""
        listed = frozenset(members)
        for member in self.listed - listed:
            self._absent.setdefault(member, now)
        for member in listed:
            self._absent.pop(member, None)
        self.listed = listed
        # Forget members gone for good, so the view does not grow without end.
        for member, since in list(self._absent.items()):
            if now - since >= self.grace:
                del self._absent[member]
                self._down.pop(member, None)

    def failed(self, member: str, now: float) -> None:
        """A call to `member` failed (no connection, no answer in time, broke off)."""
        if member == self.me:
            return
        down = self._down.get(member)
        if down is None:
            self._down[member] = _Down(now, now + FIRST_BACKOFF, FIRST_BACKOFF)
        elif now >= down.retry_at:  # a retry failed: wait longer
            down.backoff = min(MAX_BACKOFF, down.backoff * 2)
            down.retry_at = now + down.backoff

    def answered(self, member: str) -> None:
        """`member` answered a call: it is up."""
        self._down.pop(member, None)

    def usable(self, member: str, now: float) -> bool:
        """Whether `member` may be asked now (not in its back-off)."""
        down = self._down.get(member)
        return down is None or now >= down.retry_at

    def owners(self, now: float) -> frozenset[str]:
        """The members that own chunks now."""
        present = self.listed | {self.me}
        present |= {m for m, since in self._absent.items() if now - since < self.grace}
        gone = {m for m, down in self._down.items() if now - down.since >= self.grace}
        return frozenset(present - gone)

    def to_probe(self, now: float) -> list[str]:
        """Members that failed and whose back-off is over: worth a probe."""
        return sorted(m for m, down in self._down.items() if now >= down.retry_at)

    def suspected(self) -> int:
        """Members whose last call failed."""
        return len(self._down)
