"""The rules a node's engine uses now: from the config at start, replaceable at runtime.

``PUT /_lota/lifecycle/rules`` hands its body to :meth:`LifecycleState.replace`; a bad
document raises :class:`~lota.errors.ConfigError` and leaves the current rules in place.
The engine takes a snapshot of the rules when a run starts, so a replacement applies from
the next run on. Rules replaced this way live in this node's memory only: until the
catalog can share them, send the call to every node (or change the config file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from lota.errors import ConfigError
from lota.lifecycle.config import rules_from_data
from lota.lifecycle.rules import Rule


class LifecycleState:
    """Holds the current rules."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self._rules = tuple(rules)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def replace(self, rules_json: str | bytes) -> tuple[Rule, ...]:
        """Validate and install rules given as JSON: a list of rules, or ``{"rules": [...]}``,
        each with the keys of a ``[[lifecycle.rules]]`` table. Returns the new rules."""
        try:
            data = json.loads(rules_json)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"lifecycle rules are not JSON: {exc}") from exc
        if isinstance(data, dict) and set(data) == {"rules"}:
            data = data["rules"]
        self._rules = rules_from_data(data)
        return self._rules

    def as_json(self) -> str:
        return json.dumps({"rules": [rule.as_dict() for rule in self._rules]})
