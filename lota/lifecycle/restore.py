"""Restore on read: a read of an archived object asks its origin to restore it.

With ``lifecycle.restore_on_read``, the read path calls :meth:`Restores.start` when the
origin answers that an object is in the archive tier; the client still gets the origin's
answer (InvalidObjectState), and a later read finds the object restored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from xml.sax.saxutils import escape

from lota.lifecycle.config import LifecycleConfig
from lota.regions.origin import OriginClient
from lota.tasks import TaskGroup

log = logging.getLogger("lota.lifecycle")


class Restores:
    """Starts restore requests as tasks of the node's group."""

    def __init__(
        self,
        config: LifecycleConfig,
        tasks: TaskGroup,
        origin_for: Callable[[str], OriginClient],
    ) -> None:
        self._config = config
        self._tasks = tasks
        self._origin_for = origin_for

    def start(self, bucket: str, key: str) -> None:
        """Ask the bucket's origin to restore an archived object someone tried to read."""
        origin = self._origin_for(bucket)
        lc = self._config
        body = (
            f"<RestoreRequest><Days>{lc.restore_days}</Days><GlacierJobParameters>"
            f"<Tier>{escape(lc.restore_tier)}</Tier></GlacierJobParameters></RestoreRequest>"
        ).encode()

        async def restore() -> None:
            headers = {"content-length": str(len(body))}
            async with origin.request(
                "POST", bucket, key, query=[("restore", "")], headers=headers, body=body
            ) as reply:
                log.info(
                    "restore of archived %s/%s requested: origin %d", bucket, key, reply.status
                )

        self._tasks.start(restore(), f"restore {bucket}/{key}")
