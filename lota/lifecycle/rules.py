"""Lifecycle rules, tiers, and the plan they make: what moves to which tier, and why. No I/O.

The engine (:mod:`lota.lifecycle.engine`) lists a bucket at the origin, joins each page with
the catalog's access records and hands both to :func:`plan`, which answers with one
:class:`Decision` per object that must move::

    decisions = plan(objects, accesses, rules, tiers, now)

Decisions, and why:

* Tiers are ordered ``hot < warm < cold < archive``; each maps to an origin storage class
  (:class:`Tiers`). Objects only ever move *colder*: LOTA never rehydrates. A read of an
  archived object does not bring it back (a restore is an origin matter), and a new write
  lands in the class the writer asks for (STANDARD by default), which makes it hot again.
* An object's current tier is what its origin ``StorageClass`` maps back to. When several
  tiers share a class (a provider without an IA class: ``warm = "STANDARD"``), the tier the
  catalog recorded wins if it is one of them, else the hottest. An object in a class no
  tier names is left alone.
* The first rule (config order) whose bucket, prefix and tags match an object governs it;
  objects no rule matches never move. A rule with no transitions therefore pins what it
  matches. A rule with ``tags`` matches objects that carry every one of those tags with
  those values (the engine reads an object's tags only when the first rule its key
  matches has tags: :func:`needs_tags`).
* ``prefix`` is a glob anchored at the start of the key: ``*`` matches within one path
  segment (never a ``/``); the key may continue after the prefix.
* Last access is the later of the catalog's last access (reads and writes through LOTA) and
  the origin's ``LastModified`` (an object never seen through LOTA). One exception: once
  the engine has moved an object (the catalog records the tier its storage class still
  shows), the origin's ``LastModified`` is the time of that copy, not of a write, so it is
  ignored; the engine records the true last access in the catalog before copying.
* The rule's transitions pick the coldest tier whose ``days_since_last_access`` has passed;
  the object goes there directly (hot -> archive is one copy, not three). Already there, or
  colder: no decision (the plan is idempotent).
* Objects smaller than ``min_size`` never move (archive classes bill a minimum size).
* ``keep_latest = N`` keeps the N most recently written *children* of each matched
  directory hot. With ``prefix = "runs/*/"`` every distinct expansion of the prefix
  (``runs/a/``, ``runs/b/``) is a matched directory; its children are the next path
  segment below it: ``runs/a/step-100/`` (a sub-directory, with everything under it) or
  ``runs/a/x.pt`` (an object directly in it). A child's age is the newest ``LastModified``
  among its objects the rule governs; the N newest children stay hot, ties broken by name
  (zero-padded step numbers sort right). Objects the engine already moved do not count as
  written (their ``LastModified`` is the copy's). ``keep_latest`` needs a prefix that ends
  in ``/`` (or is empty: the bucket's top level). :func:`plan` must see every object of a
  matched directory at once; the engine cuts its pages only between directories.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from lota.errors import ConfigError
from lota.s3.addressing import is_valid_bucket_name

TIERS = ("hot", "warm", "cold", "archive")
DAY = 86400.0
DEFAULT_MIN_SIZE = 128 * 1024
_RANK = {tier: rank for rank, tier in enumerate(TIERS)}
_STORAGE_CLASS = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_NEVER = -math.inf


def rank(tier: str) -> int:
    """0 for hot ... 3 for archive."""
    return _RANK[tier]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tiers:
    """The origin storage class each tier maps to (a provider's own class names work too)."""

    hot: str = "STANDARD"
    warm: str = "STANDARD_IA"
    cold: str = "GLACIER_IR"
    archive: str = "DEEP_ARCHIVE"
    _tiers_of: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tiers_of: dict[str, tuple[str, ...]] = {}
        for tier in TIERS:
            if not _STORAGE_CLASS.fullmatch(getattr(self, tier)):
                raise ConfigError(f"lifecycle.tiers.{tier}: {getattr(self, tier)!r} is not a class")
            tiers_of[getattr(self, tier)] = (*tiers_of.get(getattr(self, tier), ()), tier)
        object.__setattr__(self, "_tiers_of", tiers_of)

    def storage_class(self, tier: str) -> str:
        return str(getattr(self, tier))

    def current(self, storage_class: str, recorded: str | None) -> str | None:
        """The tier an object in `storage_class` is in, given the tier the catalog recorded;
        None when no tier maps to that class."""
        candidates = self._tiers_of.get(storage_class, ())
        if recorded in candidates:
            return recorded
        return candidates[0] if candidates else None

    def as_dict(self) -> dict[str, str]:
        return {tier: self.storage_class(tier) for tier in TIERS}


@dataclass(frozen=True, slots=True)
class Transition:
    """Move to `tier` once an object has gone `days` days without access."""

    days: float
    tier: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One ``[[lifecycle.rules]]`` entry; see the module docstring for what it means."""

    bucket: str
    prefix: str = ""
    min_size: int = DEFAULT_MIN_SIZE
    keep_latest: int = 0
    transitions: tuple[Transition, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs an object must all carry for the rule to match it."""
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"lifecycle rule {self.bucket}/{self.prefix}"
        if not is_valid_bucket_name(self.bucket):
            raise ConfigError(f"{where}: {self.bucket!r} is not a valid bucket name")
        if self.prefix.startswith("/"):
            raise ConfigError(f"{where}: prefix must not start with '/'")
        if self.min_size < 0 or self.keep_latest < 0:
            raise ConfigError(f"{where}: min_size and keep_latest must not be negative")
        if self.keep_latest and self.prefix and not self.prefix.endswith("/"):
            raise ConfigError(f"{where}: keep_latest needs a prefix that ends in '/' (a directory)")
        steps = tuple(sorted(self.transitions, key=lambda t: t.days))
        for step in steps:
            if step.tier not in _RANK or step.tier == "hot":
                raise ConfigError(f"{where}: transition tier must be warm, cold or archive")
            if not step.days >= 0:
                raise ConfigError(f"{where}: days_since_last_access must not be negative")
        for earlier, later in itertools.pairwise(steps):
            if earlier.days == later.days or rank(earlier.tier) >= rank(later.tier):
                raise ConfigError(f"{where}: transitions must go colder as the days grow")
        object.__setattr__(self, "transitions", steps)
        object.__setattr__(self, "tags", tuple(sorted(self.tags)))
        parts = re.split(r"(\*)", self.prefix)
        regex = "".join("[^/]*" if part == "*" else re.escape(part) for part in parts)
        object.__setattr__(self, "_pattern", re.compile(regex))

    @property
    def name(self) -> str:
        return f"{self.bucket}/{self.prefix}"

    @property
    def literal_prefix(self) -> str:
        """The part of the prefix before its first ``*``: what a listing can ask for."""
        return self.prefix.partition("*")[0]

    def directory(self, bucket: str, key: str) -> str | None:
        """The expansion of the prefix that `key` lies under; None if it does not match."""
        if bucket != self.bucket:
            return None
        match = self._pattern.match(key)
        return match.group(0) if match else None

    def tags_match(self, tags: Mapping[str, str] | None) -> bool:
        """Whether an object with `tags` (None: not read) has every tag the rule asks for."""
        return all(tags is not None and tags.get(k) == v for k, v in self.tags)

    def target(self, days: float) -> Transition | None:
        """The coldest transition due after `days` days without access."""
        due = None
        for step in self.transitions:
            if days >= step.days:
                due = step
        return due

    def as_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "min_size": self.min_size,
            "keep_latest": self.keep_latest,
            "transitions": [
                {"days_since_last_access": t.days, "tier": t.tier} for t in self.transitions
            ],
            **({"tags": dict(self.tags)} if self.tags else {}),
        }


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as the origin lists it; `last_modified` in seconds since the epoch."""

    bucket: str
    key: str
    size: int
    last_modified: float
    storage_class: str = "STANDARD"
    etag: str = ""
    tags: Mapping[str, str] | None = None
    """The object's tags, when the rules need them (:func:`needs_tags`); None: not read."""


class Usage(Protocol):
    """What the catalog knows about an object (:class:`lota.catalog.AccessRecord`)."""

    @property
    def last_access(self) -> float | None: ...

    @property
    def tier(self) -> str | None: ...

    @property
    def tier_at(self) -> float | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """Move one object from `from_tier` to `to_tier` (origin class `storage_class`)."""

    bucket: str
    key: str
    size: int
    from_tier: str
    to_tier: str
    storage_class: str
    reason: str
    # What the listing showed, so the engine can tell whether the object changed since.
    from_class: str = "STANDARD"
    etag: str = ""
    # The object's last access as the plan computed it (the engine records it first).
    last_access: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "key": self.key,
            "size": self.size,
            "from": self.from_tier,
            "to": self.to_tier,
            "storage_class": self.storage_class,
            "reason": self.reason,
        }

    def line(self) -> str:
        """Tab-separated: bucket, key (escaped if it holds control characters), from, to,
        reason."""
        key = self.key if self.key.isprintable() else self.key.encode("unicode_escape").decode()
        return f"{self.bucket}\t{key}\t{self.from_tier}\t{self.to_tier}\t{self.reason}"


@dataclass(slots=True)
class _Seen:
    """One object with its governing rule and what it means for the plan."""

    obj: ObjectInfo
    rule: Rule
    current: str | None
    last_access: float
    written: float
    directory: str


def plan(
    objects: Iterable[ObjectInfo],
    accesses: Mapping[tuple[str, str], Usage],
    rules: Sequence[Rule],
    tiers: Tiers,
    now: float,
) -> list[Decision]:
    """The transitions due at `now` for `objects`, in their order.

    `accesses` holds the catalog's record of each object it knows, by (bucket, key).
    Every object of a ``keep_latest`` directory must be among `objects`.
    """
    seen = [s for obj in objects if (s := _see(obj, accesses, rules, tiers)) is not None]
    kept = _kept_children(seen)
    decisions = []
    for s in seen:
        if (decision := _decide(s, kept, tiers, now)) is not None:
            decisions.append(decision)
    return decisions


def _see(
    obj: ObjectInfo, accesses: Mapping[tuple[str, str], Usage], rules: Sequence[Rule], tiers: Tiers
) -> _Seen | None:
    for rule in rules:
        directory = rule.directory(obj.bucket, obj.key)
        if directory is not None and rule.tags_match(obj.tags):
            break
    else:
        return None
    usage = accesses.get((obj.bucket, obj.key))
    recorded = usage.tier if usage is not None else None
    current = tiers.current(obj.storage_class, recorded)
    # The engine moved it and nothing rewrote it since: LastModified is the copy's time.
    moved = recorded is not None and recorded == current
    accessed = usage.last_access if usage is not None else None
    if moved:
        assert usage is not None
        if accessed is None:
            accessed = usage.tier_at if usage.tier_at is not None else obj.last_modified
        return _Seen(obj, rule, current, accessed, _NEVER, directory)
    last = obj.last_modified if accessed is None else max(accessed, obj.last_modified)
    return _Seen(obj, rule, current, last, obj.last_modified, directory)


def needs_tags(obj: ObjectInfo, rules: Sequence[Rule]) -> bool:
    """Whether which rule governs `obj` depends on its tags: the first rule its key matches
    has tag filters (reading tags costs a request per object, so only then)."""
    for rule in rules:
        if rule.directory(obj.bucket, obj.key) is not None:
            return bool(rule.tags)
    return False


def child_of(directory: str, key: str) -> str:
    """The child of `directory` that `key` lies in: the next path segment (with its ``/``),
    or the rest of the key for an object directly in the directory."""
    slash = key.find("/", len(directory))
    return key[len(directory) :] if slash < 0 else key[len(directory) : slash + 1]


def _kept_children(seen: Sequence[_Seen]) -> set[tuple[int, str, str]]:
    """(rule id, directory, child) of the newest `keep_latest` children of each directory."""
    newest: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    keep: dict[int, int] = {}
    for s in seen:
        if s.rule.keep_latest:
            keep[id(s.rule)] = s.rule.keep_latest
            children = newest[id(s.rule), s.directory]
            child = child_of(s.directory, s.obj.key)
            children[child] = max(children.get(child, _NEVER), s.written)
    kept: set[tuple[int, str, str]] = set()
    for (rule_id, directory), children in newest.items():
        ranked = sorted(children.items(), key=lambda item: (item[1], item[0]), reverse=True)
        kept.update((rule_id, directory, child) for child, _ in ranked[: keep[rule_id]])
    return kept


def _decide(s: _Seen, kept: set[tuple[int, str, str]], tiers: Tiers, now: float) -> Decision | None:
    rule, obj = s.rule, s.obj
    if s.current is None or obj.size < rule.min_size:
        return None
    if rule.keep_latest and (id(rule), s.directory, child_of(s.directory, obj.key)) in kept:
        return None
    days = (now - s.last_access) / DAY
    step = rule.target(days)
    if step is None or rank(step.tier) <= rank(s.current):
        return None
    return Decision(
        bucket=obj.bucket,
        key=obj.key,
        size=obj.size,
        from_tier=s.current,
        to_tier=step.tier,
        storage_class=tiers.storage_class(step.tier),
        reason=f"unread for {math.floor(days)} days (rule {rule.name} -> {step.tier} "
        f"after {step.days:g})",
        from_class=obj.storage_class,
        etag=obj.etag,
        last_access=s.last_access,
    )


def splits_directory(rules: Sequence[Rule], bucket: str, before: str, after: str) -> bool:
    """Whether a page boundary between keys `before` and `after` (in key order) would cut a
    ``keep_latest`` directory in two (keys under one directory are contiguous)."""
    for rule in rules:
        if rule.keep_latest:
            directory = rule.directory(bucket, before)
            if directory is not None and after.startswith(directory):
                return True
    return False


def listing_prefix(rules: Sequence[Rule], bucket: str) -> str:
    """The longest prefix every rule for `bucket` lies under: what to list at the origin."""
    prefixes = [rule.literal_prefix for rule in rules if rule.bucket == bucket]
    if not prefixes:
        return ""
    first, last = min(prefixes), max(prefixes)
    common = 0
    while common < min(len(first), len(last)) and first[common] == last[common]:
        common += 1
    return first[:common]


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """What the rules say about one object (``lota lifecycle status``)."""

    tier: str | None
    """Its tier now; None when its storage class is no tier's."""
    last_access: float
    rule: str = ""
    """The governing rule's name; "" when none matches."""
    next_tier: str = ""
    due_at: float | None = None
    """When it moves to `next_tier` (at or before now: at the next run)."""
    note: str = ""
    """Why it never moves, or what may keep it where it is."""


def explain(
    obj: ObjectInfo, usage: Usage | None, rules: Sequence[Rule], tiers: Tiers, now: float
) -> Status:
    """Which rule governs `obj`, and when it would move where (as :func:`plan` decides)."""
    recorded = usage.tier if usage is not None else None
    seen = _see(obj, {(obj.bucket, obj.key): usage} if usage is not None else {}, rules, tiers)
    if seen is None:
        accessed = usage.last_access if usage is not None else None
        last = obj.last_modified if accessed is None else max(accessed, obj.last_modified)
        current = tiers.current(obj.storage_class, recorded)
        return Status(tier=current, last_access=last, note="no rule matches it: it never moves")
    status = Status(tier=seen.current, last_access=seen.last_access, rule=seen.rule.name)
    rule = seen.rule
    if seen.current is None:
        note = f"its storage class {obj.storage_class} is no tier's: it is left alone"
        return replace(status, note=note)
    if obj.size < rule.min_size:
        return replace(status, note=f"smaller than the rule's min_size ({rule.min_size})")
    colder = [t for t in rule.transitions if rank(t.tier) > rank(seen.current)]
    if not colder:
        return replace(status, note="no transition of its rule goes colder")
    days = (now - seen.last_access) / DAY
    due = rule.target(days)
    step = due if due is not None and rank(due.tier) > rank(seen.current) else colder[0]
    note = ""
    if rule.keep_latest:
        note = (
            f"kept hot while among the {rule.keep_latest} newest children of "
            f"{seen.directory} (keep_latest)"
        )
    at = seen.last_access + step.days * DAY
    return replace(status, next_tier=step.tier, due_at=at, note=note)
