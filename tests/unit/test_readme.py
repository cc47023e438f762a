"""The README's reference tables say what the code accepts and exports, no more, no less."""

from __future__ import annotations

import re
from pathlib import Path

from lota.config import settings
from lota.metrics import Metrics

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"### {title}\n")
    end = README.find("\n#", start + 4)
    return README[start:end]


def test_the_configuration_reference_lists_every_setting_and_its_variable() -> None:
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", _section("Configuration reference"), re.M)
    assert len(rows) == len(set(rows)), "a setting listed twice"
    assert sorted(rows) == sorted((s.path, s.variable) for s in settings())


class _Store:
    def usage(self) -> int:
        return 0

    def budget(self) -> int:
        return 0

    def stats(self) -> dict[str, int]:
        return {}

    def dir_stats(self) -> dict[str, dict[str, int]]:
        return {"/d": {"bytes_used": 0, "free_bytes": 0, "budget": 0, "healthy": 1}}


def test_the_metrics_table_lists_every_metric_a_node_exports() -> None:
    metrics = Metrics()
    metrics.watch_store(_Store())
    exported = set()
    for family in metrics.registry.collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        exported.add(family.name + suffix)
    listed = set(re.findall(r"`(lota_[a-z_]+)", _section("Metrics")))
    assert listed == exported
