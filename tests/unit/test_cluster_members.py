"""Membership: who owns chunks across restarts and outages, and who may be asked now."""

from __future__ import annotations

from lota.cluster.members import FIRST_BACKOFF, MAX_BACKOFF, Membership

A, B, C = "10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9000"


def _view(now: float = 0.0) -> Membership:
    view = Membership(A, grace=60.0)
    view.update([A, B, C], now)
    return view


def test_a_member_down_for_less_than_the_grace_keeps_its_chunks_but_is_skipped() -> None:
    view = _view()
    view.failed(B, 10.0)
    assert view.owners(69.0) == {A, B, C}  # a rolling restart reshuffles nothing
    assert not view.usable(B, 10.5) and view.usable(B, 10.0 + FIRST_BACKOFF)
    assert view.suspected() == 1 and view.to_probe(10.5) == []
    assert view.to_probe(11.0) == [B]
    assert view.owners(70.0) == {A, C}  # down for the whole grace: its chunks move on
    view.answered(B)  # it came back (a probe or a request got an answer)
    assert view.owners(80.0) == {A, B, C} and view.usable(B, 80.0)


def test_the_back_off_doubles_on_each_failed_retry_up_to_its_cap() -> None:
    view = _view()
    view.failed(B, 0.0)
    retry = FIRST_BACKOFF
    backoff = FIRST_BACKOFF
    for _ in range(10):
        view.failed(B, retry - 0.1)  # another failure inside the back-off changes nothing
        assert not view.usable(B, retry - 0.01)
        view.failed(B, retry)  # the retry failed
        backoff = min(MAX_BACKOFF, backoff * 2)
        retry += backoff
    assert backoff == MAX_BACKOFF and view.usable(B, retry)


def test_a_member_missing_from_dns_owns_its_chunks_for_the_grace_then_is_forgotten() -> None:
    view = _view()
    view.update([A, C], 5.0)
    assert view.owners(60.0) == {A, B, C}
    view.update([A, C], 65.0)
    assert view.owners(65.0) == {A, C}
    view.update([A, B, C], 70.0)  # it came back under the same address
    assert view.owners(70.0) == {A, B, C}


def test_this_node_always_owns_and_is_never_suspected() -> None:
    view = Membership(A, grace=1.0)
    view.update([B], 0.0)  # not in DNS yet
    view.failed(A, 0.0)
    assert view.owners(100.0) == {A, B} and view.usable(A, 0.0) and view.suspected() == 0
