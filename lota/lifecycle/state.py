"""The rules every node's engine uses: the config's as a seed, the catalog's once replaced.

``PUT /_lota/lifecycle/rules`` hands its body to :meth:`LifecycleState.replace`: a bad
document raises :class:`~lota.errors.ConfigError` and leaves the current rules in place; a
good one is stored in the catalog as the next version of the ``lifecycle-rules`` document,
and every node, told by the catalog's ``document`` event, loads it
(:meth:`LifecycleState.load`): one rule set for the whole cluster, in every region, within
the catalog's event delay (SQLite polls every 0.5 s, PostgreSQL notifies). A node starts
with the catalog's latest version if there is one; the config's rules (version 0) only
count until the first replacement. The engine takes a snapshot of the rules when a run
starts, so a replacement applies from the next run on. Without a catalog the rules are
this node's alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

from lota.errors import ConfigError
from lota.lifecycle.config import rules_from_data
from lota.lifecycle.rules import Rule

log = logging.getLogger("lota.lifecycle")

RULES_DOCUMENT = "lifecycle-rules"


class Documents(Protocol):
    """Where versioned documents live (:class:`lota.catalog.Catalog`)."""

    async def put_document(self, name: str, body: str) -> int: ...

    async def get_document(self, name: str) -> tuple[int, str] | None: ...


class LifecycleState:
    """Holds the current rules and their version (0: the config's)."""

    def __init__(self, rules: Sequence[Rule] = (), documents: Documents | None = None) -> None:
        self._rules = tuple(rules)
        self.version = 0
        self._documents = documents

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def share(self, documents: Documents) -> None:
        """From now on, replacements go through `documents` (the catalog) to every node."""
        self._documents = documents

    async def replace(self, rules_json: str | bytes) -> tuple[Rule, ...]:
        """Validate rules given as JSON (a list of rules, or ``{"rules": [...]}``, each with
        the keys of a ``[[lifecycle.rules]]`` table) and install them for every node.
        Returns the new rules."""
        rules = parse_rules(rules_json)
        version = self.version + 1
        if self._documents is not None:
            version = await self._documents.put_document(RULES_DOCUMENT, _document(rules))
        self._install(rules, version)
        return rules

    async def load(self) -> bool:
        """Take the catalog's rules if they are newer than these; True if they were."""
        if self._documents is None:
            return False
        found = await self._documents.get_document(RULES_DOCUMENT)
        if found is None or found[0] <= self.version:
            return False
        version, body = found
        try:
            rules = parse_rules(body)
        except ConfigError as exc:  # written by a newer LOTA, say: keep what works
            log.error("lifecycle rules version %d in the catalog are unusable: %s", version, exc)
            return False
        self._install(rules, version)
        return True

    def _install(self, rules: tuple[Rule, ...], version: int) -> None:
        self._rules, self.version = rules, version
        log.info("lifecycle rules: version %d, %d rule(s)", version, len(rules))

    def as_json(self) -> str:
        return json.dumps({"version": self.version, "rules": [r.as_dict() for r in self._rules]})


def parse_rules(rules_json: str | bytes) -> tuple[Rule, ...]:
    """Rules from their JSON document; :class:`ConfigError` names what is wrong."""
    try:
        data = json.loads(rules_json)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"lifecycle rules are not JSON: {exc}") from exc
    if isinstance(data, dict) and set(data) - {"version"} == {"rules"}:
        data = data["rules"]
    return rules_from_data(data)


def _document(rules: tuple[Rule, ...]) -> str:
    return json.dumps({"rules": [rule.as_dict() for rule in rules]})
