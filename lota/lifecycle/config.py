"""The ``[lifecycle]`` section of the config, and rules from TOML or JSON.

::

    [lifecycle]
    interval = "1h"          # how often a server runs the engine (0: never)
    rate = 10                # transitions per second at most; 0: no limit
    lease = "60s"            # the engine's catalog lease; another node takes over after it

    [lifecycle.tiers]        # the defaults; a provider's own class names work too
    hot = "STANDARD"
    warm = "STANDARD_IA"
    cold = "GLACIER_IR"
    archive = "DEEP_ARCHIVE"

    [[lifecycle.rules]]
    bucket = "ckpt"
    prefix = "runs/*/"       # glob; '*' matches within one path segment
    min_size = "128KiB"      # smaller objects never move (the default)
    keep_latest = 3          # the 3 newest children of each matched directory stay hot
    tags = { stage = "final" }   # only objects tagged so (all of them must match)
    transitions = [ { days_since_last_access = 60, tier = "archive" } ]

"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lota.errors import ConfigError
from lota.lifecycle.rules import DEFAULT_MIN_SIZE, TIERS, Rule, Tiers, Transition
from lota.settings import Duration, parse_size, section_values

_RULE_KEYS = frozenset({"bucket", "prefix", "min_size", "keep_latest", "transitions", "tags"})
_TRANSITION_KEYS = frozenset({"days_since_last_access", "tier"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleConfig:
    """Tiers, rules and how the engine runs. Build it with :func:`from_toml`."""

    tiers: Tiers = field(default_factory=Tiers)
    # Seconds between the server's own engine runs; 0 turns them off.
    interval: Duration = 3600.0
    # Transitions per second at most (0: no limit): copies load the origin.
    rate: float = 10.0
    # Seconds the engine's catalog lease lasts unless renewed.
    lease: Duration = 60.0
    rules: tuple[Rule, ...] = ()
    # A GET of an object the origin keeps in a class that must be restored first answers
    # the origin's InvalidObjectState; with this on, LOTA also asks the origin to restore
    # it (for restore_days, at restore_tier) so that a retry later succeeds.
    restore_on_read: bool = False
    restore_days: int = 1
    restore_tier: str = "Standard"

    def __post_init__(self) -> None:
        if self.interval < 0 or self.rate < 0:
            raise ConfigError("lifecycle.interval and lifecycle.rate must not be negative")
        if self.lease < 5:
            raise ConfigError("lifecycle.lease must be at least 5s")


def from_toml(section: Mapping[str, Any]) -> LifecycleConfig:
    """The ``[lifecycle]`` table (already parsed) as a :class:`LifecycleConfig`."""
    values = section_values(section, LifecycleConfig, "lifecycle.", special={"tiers", "rules"})
    if "tiers" in values:
        values["tiers"] = tiers_from_data(values["tiers"])
    if "rules" in values:
        values["rules"] = rules_from_data(values["rules"])
    return LifecycleConfig(**values)


def tiers_from_data(data: Any) -> Tiers:
    if not isinstance(data, Mapping):
        raise ConfigError('lifecycle.tiers must be a table: hot = "STANDARD", ...')
    unknown = set(data) - set(TIERS)
    if unknown:
        raise ConfigError(f"unknown tier(s) in lifecycle.tiers: {', '.join(sorted(unknown))}")
    return Tiers(**{tier: str(value) for tier, value in data.items()})


def rules_from_data(data: Any) -> tuple[Rule, ...]:
    """Rules from a list of tables (TOML) or objects (JSON), validated."""
    if not isinstance(data, Sequence) or isinstance(data, str | bytes):
        raise ConfigError("lifecycle.rules must be a list of rules")
    return tuple(_rule(item, index) for index, item in enumerate(data))


def _rule(data: Any, index: int) -> Rule:
    where = f"lifecycle.rules[{index}]"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table")
    unknown = set(data) - _RULE_KEYS
    if unknown:
        raise ConfigError(f"unknown setting(s) in {where}: {', '.join(sorted(unknown))}")
    if not isinstance(data.get("bucket"), str):
        raise ConfigError(f"{where} needs a bucket")
    transitions = data.get("transitions", [])
    if not isinstance(transitions, Sequence) or isinstance(transitions, str | bytes):
        raise ConfigError(f"{where}.transitions must be a list")
    keep = data.get("keep_latest", 0)
    if not isinstance(keep, int) or isinstance(keep, bool):
        raise ConfigError(f"{where}.keep_latest must be a whole number")
    return Rule(
        bucket=data["bucket"],
        prefix=str(data.get("prefix", "")),
        min_size=parse_size(data.get("min_size", DEFAULT_MIN_SIZE)),
        keep_latest=keep,
        transitions=tuple(_transition(t, f"{where}.transitions") for t in transitions),
        tags=_tags(data.get("tags", {}), f"{where}.tags"),
    )


def _tags(data: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(data, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ConfigError(f'{where} must be a table of strings: {{ stage = "final" }}')
    return tuple(data.items())


def _transition(data: Any, where: str) -> Transition:
    if not isinstance(data, Mapping) or set(data) != _TRANSITION_KEYS:
        raise ConfigError(f'{where}: each is {{ days_since_last_access = N, tier = "archive" }}')
    return Transition(
        _number(data["days_since_last_access"], f"{where}.days_since_last_access"),
        str(data["tier"]),
    )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number, got {value!r}")
    return float(value)
