"""A migrator that loses its lease stops copying: its copy must not land after a newer one."""

from __future__ import annotations

import asyncio
from typing import Any

from lota.catalog.model import CatalogObject
from lota.clock import FakeClock
from lota.config import WriteConfig
from lota.errors import CatalogUnavailable
from lota.metrics import Metrics
from lota.regions.migrator import Migrator


class Catalog:
    """Just the calls a migration makes; renewals answer from `renewals`."""

    def __init__(self, renewals: list[bool | Exception]) -> None:
        self.renewals = renewals
        self.calls: list[str] = []

    async def renew_lease(self, *_: Any) -> bool:
        self.calls.append("renew")
        answer = self.renewals.pop(0) if self.renewals else True
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def complete_migration(self, *_: Any) -> bool:
        self.calls.append("complete")
        return True

    async def fail_migration(self, *_: Any) -> None:
        self.calls.append("fail")


def migrator(catalog: Catalog, copy_seconds: float) -> tuple[Migrator, list[str]]:
    m = Migrator(catalog, None, None, None, WriteConfig(lease=0.3), Metrics(), FakeClock())  # type: ignore[arg-type]
    landed: list[str] = []

    async def move(obj: CatalogObject) -> None:
        await asyncio.sleep(copy_seconds)
        landed.append(obj.key)

    m._move = move  # type: ignore[method-assign]
    return m, landed


def version() -> CatalogObject:
    return CatalogObject(bucket="b", key="k", seq=1, size=1, etag='"e"')


async def test_a_refused_renewal_stops_the_copy_before_it_lands() -> None:
    catalog = Catalog([True, False])
    m, landed = migrator(catalog, copy_seconds=1.0)
    await m._migrate(version())
    assert landed == [] and "complete" not in catalog.calls and "fail" not in catalog.calls


async def test_a_renewal_that_cannot_reach_the_catalog_stops_the_copy_too() -> None:
    catalog = Catalog([CatalogUnavailable("down")])
    m, landed = migrator(catalog, copy_seconds=1.0)
    await m._migrate(version())
    assert landed == [] and "complete" not in catalog.calls


async def test_a_copy_that_keeps_its_lease_completes() -> None:
    catalog = Catalog([])
    m, landed = migrator(catalog, copy_seconds=0.35)
    await m._migrate(version())
    assert landed == ["k"] and catalog.calls[-1] == "complete" and "renew" in catalog.calls
