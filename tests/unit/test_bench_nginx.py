"""bench.nginx's rounds: what a cell's table row says of its rounds."""

from __future__ import annotations

import pytest

from bench import nginx
from bench.nginx import LoopLooks, medians


def _cell(
    req_per_s: float, p99: float, errors: dict[str, int], late: float | None = None
) -> dict[str, object]:
    return {
        "n": 100,
        "errors": errors,
        "req_per_s": req_per_s,
        "cpu_us_per_req": req_per_s / 1000,
        "client_cpu_us_per_req": 1.0,
        "client_busy": 0.5,
        "client_waiting": 0.1,
        "idle": 0.25,
        "loop_late": late,
        "p50": p99 / 2,
        "p99": p99,
        "p99.9": p99 * 2,
    }


def test_a_row_gives_each_figures_median_every_rounds_rate_and_every_error() -> None:
    row = medians(
        [
            _cell(30_000, 4.0, {}),
            _cell(10_000, 9.0, {"status 503, 0 bytes": 2}),
            _cell(20_000, 1.0, {"status 503, 0 bytes": 1, "TimeoutError": 1}),
        ]
    )
    assert (row["req_per_s"], row["p99"], row["p50"], row["cpu_us_per_req"]) == (
        20_000,
        4.0,
        2.0,
        20.0,
    )
    assert row["rounds_req_per_s"] == [30_000, 10_000, 20_000]
    assert row["n"] == 300
    assert row["errors"] == {"status 503, 0 bytes": 3, "TimeoutError": 1}


def test_of_two_rounds_the_row_takes_the_upper() -> None:
    row = medians([_cell(10_000, 2.0, {}), _cell(20_000, 1.0, {})])
    assert (row["req_per_s"], row["p99"]) == (20_000, 2.0)


def test_how_late_the_loops_ran_is_a_median_for_lota_and_none_for_nginx() -> None:
    assert medians([_cell(1, 1.0, {}, late) for late in (0.3, 0.01, 0.02)])["loop_late"] == 0.02
    assert medians([_cell(1, 1.0, {}) for _ in range(3)])["loop_late"] is None


class _Scraped:
    """A node whose metrics say, scrape after scrape, (looks, looks more than 5 ms late)."""

    def __init__(self, *counts: tuple[int, int]) -> None:
        self._counts = iter(counts)

    def metrics(self) -> str:
        looks, late = next(self._counts)
        return (
            f'lota_event_loop_lag_seconds_bucket{{le="0.002"}} {looks - late - 1}.0\n'
            f'lota_event_loop_lag_seconds_bucket{{le="0.005"}} {looks - late}.0\n'
            f"lota_event_loop_lag_seconds_count {looks}.0\n"
        )


def test_a_cells_late_looks_are_counted_but_for_those_its_first_scrape_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nginx.time, "sleep", lambda seconds: None)
    # Idle, each scrape made one late look but one (the median of five: 1).
    looks = LoopLooks(
        _Scraped((10, 0), (20, 1), (30, 2), (40, 2), (50, 3), (60, 4), (60, 4), (160, 9))
    )  # type: ignore[arg-type]
    looks.calibrate()
    assert looks.per_scrape == 1
    assert looks.late_share(looks(), looks()) == (9 - 4 - 1) / 100
    assert looks.late_share((0, 5), (10, 5)) == 0  # fewer than a scrape makes: none
