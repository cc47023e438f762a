"""IAM-style identity policies: which actions a principal may take on which resources.

A :class:`Policy` is parsed once from the IAM JSON grammar and compiled into one regular
expression per statement field, because :meth:`Policy.allows` runs on every request
(cache hits included). Evaluation follows IAM: an explicit ``Deny`` wins, otherwise a
matching ``Allow`` is needed, otherwise the request is denied.

What is deliberately *not* supported is rejected with a :class:`ValueError` rather than
ignored, so a policy never grants more than its author meant: ``Condition`` blocks,
``Principal``/``NotPrincipal`` (these are identity policies, not bucket policies) and
policy variables such as ``${aws:username}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_VERSIONS = frozenset({"2012-10-17", "2008-10-17"})
_STATEMENT_KEYS = frozenset(
    {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition"}
)
_ACTION_RE = re.compile(r"[A-Za-z0-9*?-]+:[A-Za-z0-9*?-]+")
_UNSUPPORTED = {
    "Condition": "Condition is not supported",
    "Principal": "Principal is not supported in identity policies",
    "NotPrincipal": "NotPrincipal is not supported in identity policies",
}


def wildcard_regex(patterns: Iterable[str], *, ignore_case: bool) -> re.Pattern[str]:
    """One compiled alternation of IAM wildcard patterns (``*`` any run, ``?`` one char).

    Every other character is escaped, so resource names full of regex metacharacters
    (``.``, ``+``, ``(``, ``[``...) match only themselves.
    """
    parts = []
    for pattern in patterns:
        escaped = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
        parts.append(escaped)
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile("(?:" + "|".join(parts) + ")", flags)


@dataclass(frozen=True, slots=True)
class _Statement:
    allow: bool
    actions: re.Pattern[str]
    not_action: bool  # True when the statement used NotAction
    resources: re.Pattern[str]
    not_resource: bool

    def applies(self, action: str, resource: str) -> bool:
        if (self.actions.fullmatch(action) is None) != self.not_action:
            return False
        return (self.resources.fullmatch(resource) is None) == self.not_resource


class Policy:
    """A parsed, compiled identity policy. Build it with :meth:`from_json` or :meth:`deny_all`."""

    __slots__ = ("_allows", "_denies", "source")

    def __init__(self, statements: Iterable[_Statement], source: str = "") -> None:
        statements = tuple(statements)
        self._denies = tuple(s for s in statements if not s.allow)
        self._allows = tuple(s for s in statements if s.allow)
        self.source = source

    @classmethod
    def deny_all(cls) -> Policy:
        """The policy of a principal that was given none: every request is denied."""
        return cls((), source="")

    @classmethod
    def from_json(cls, text: str) -> Policy:
        """Parse an IAM policy document; raise :class:`ValueError` saying what is wrong."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"policy is not valid JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise ValueError("policy must be a JSON object")
        unknown = set(document) - {"Version", "Id", "Statement"}
        if unknown:
            raise ValueError(f"unknown policy field(s): {', '.join(sorted(unknown))}")
        version = document.get("Version", "2012-10-17")
        if version not in _VERSIONS:
            raise ValueError(f"unsupported policy Version {version!r}")
        raw = document.get("Statement")
        if isinstance(raw, dict):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            raise ValueError("policy needs a Statement (an object or a non-empty list)")
        return cls((_parse_statement(s, i) for i, s in enumerate(raw)), source=text)

    def allows(self, action: str, resource: str) -> bool:
        """Whether `action` on `resource` is allowed: no Deny applies and some Allow does."""
        for statement in self._denies:
            if statement.applies(action, resource):
                return False
        return any(statement.applies(action, resource) for statement in self._allows)

    def __repr__(self) -> str:
        return f"Policy(allow={len(self._allows)}, deny={len(self._denies)})"


def _parse_statement(raw: Any, index: int) -> _Statement:
    where = f"Statement[{index}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a JSON object")
    for key, problem in _UNSUPPORTED.items():
        if key in raw:
            raise ValueError(f"{where}: {problem}")
    unknown = set(raw) - _STATEMENT_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    effect = raw.get("Effect")
    if effect not in ("Allow", "Deny"):
        raise ValueError(f'{where}: Effect must be "Allow" or "Deny", got {effect!r}')
    actions, not_action = _exactly_one(raw, "Action", "NotAction", where)
    resources, not_resource = _exactly_one(raw, "Resource", "NotResource", where)
    for action in actions:
        if action != "*" and _ACTION_RE.fullmatch(action) is None:
            raise ValueError(f'{where}: {action!r} is not an action (expected e.g. "s3:GetObject")')
    for resource in resources:
        if "${" in resource:
            raise ValueError(f"{where}: policy variables are not supported ({resource!r})")
    return _Statement(
        allow=effect == "Allow",
        actions=wildcard_regex(actions, ignore_case=True),
        not_action=not_action,
        resources=wildcard_regex(resources, ignore_case=False),
        not_resource=not_resource,
    )


def _exactly_one(
    raw: dict[str, Any], name: str, negated: str, where: str
) -> tuple[list[str], bool]:
    """The string list under `name` or `negated` (exactly one must be present)."""
    if (name in raw) == (negated in raw):
        raise ValueError(f"{where}: needs exactly one of {name} or {negated}")
    key = name if name in raw else negated
    value = raw[key]
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: {key} must be a string or a non-empty list of strings")
    if not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{where}: {key} must contain only non-empty strings")
    return values, key == negated
