"""bench.nginx's rounds: what a cell's table row says of its rounds."""

from __future__ import annotations

from bench.nginx import medians


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
