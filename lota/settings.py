"""What a setting's value may be, and the one rule that turns what a user wrote into it.

A config field's annotation names its kind: ``Size`` (``"10GiB"``, ``"512MB"``, a byte
count), ``Duration`` (``"30s"``, ``"5m"``, ``"60d"``, seconds), ``int``, ``float``,
``bool``, ``str``, a ``Literal`` of strings, or ``tuple[str, ...]`` (a list; from a
``LOTA_*`` variable, comma-separated). :func:`coerce` turns a TOML value or a variable's
string into that kind, so the file and the environment accept the same things and a
bad value is refused naming where it came from.

This module imports nothing of LOTA's but :mod:`lota.errors` (for :class:`ConfigError`),
so every config module can use it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from typing import Any

from lota.errors import ConfigError

# Annotations for config fields: the type checker sees int/float, coerce() the name.
Size = int
Duration = float

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_size(value: str | int) -> int:
    """``"10GiB"`` -> 10737418240. Plain integers are bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"size must not be negative: {value}")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f"not a size: {value!r} (use e.g. 512MiB, 10GiB, 1TiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def parse_duration(value: str | float) -> float:
    """``"30s"`` -> 30.0, ``"60d"`` -> 5184000.0. Plain numbers are seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(value))
    if not match or match.group(2) not in _DURATION_UNITS:
        raise ConfigError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h, 60d)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def coerce(value: Any, kind: str, where: str) -> Any:
    """`value` as the `kind` a field is annotated with; ConfigError naming `where` if not.

    Strings are parsed for every kind (that is what a ``LOTA_*`` variable holds)."""
    try:
        return _COERCE.get(kind, _other)(value, kind)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be {_describe(kind)}, got {value!r}") from None


def section_values(
    data: Any, cls: type, where: str, special: Collection[str] = ()
) -> dict[str, Any]:
    """The settings of one TOML table for dataclass `cls`, each coerced to its field's kind
    (`special` ones are left as written, for the caller). An unknown setting is an error
    rather than silently ignored, so a typo does not go unnoticed."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where.rstrip('.') or 'the config'} must be a table")
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name != "name"}
    unknown = set(data) - set(kinds)
    if unknown:
        place = where.rstrip(".") or "top level"
        raise ConfigError(f"unknown setting(s) in {place}: {', '.join(sorted(unknown))}")
    return {
        key: value if key in special else coerce(value, kinds[key], where + key)
        for key, value in data.items()
    }


def split_list(value: str) -> list[str]:
    """``"a, b,,c"`` -> ["a", "b", "c"]: how a variable spells a list."""
    return [item.strip() for item in value.split(",") if item.strip()]


def split_table(value: str, where: str) -> dict[str, str]:
    """``"a=1, b=2"`` -> {"a": "1", "b": "2"}: how a variable spells a table."""
    table: dict[str, str] = {}
    for item in split_list(value):
        key, sep, entry = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where} must be KEY=VALUE pairs, comma-separated, got {item!r}")
        table[key.strip()] = entry.strip()
    return table


def _size(value: Any, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError
    return parse_size(value)


def _duration(value: Any, kind: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError
    return parse_duration(value)


def _int(value: Any, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError
    return int(value)


def _float(value: Any, kind: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError
    return float(value)


def _bool(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise TypeError


def _strings(value: Any, kind: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(split_list(value))
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError
    return tuple(value)


def _other(value: Any, kind: str) -> str:
    """``str`` and ``Literal[...]`` (whose choices the dataclass checks)."""
    if kind != "str" and not kind.startswith("Literal["):
        raise AssertionError(f"no rule for settings of type {kind}")
    if not isinstance(value, str):
        raise TypeError
    return value


_COERCE = {
    "Size": _size,
    "Duration": _duration,
    "int": _int,
    "float": _float,
    "bool": _bool,
    "tuple[str, ...]": _strings,
}


def _describe(kind: str) -> str:
    return {
        "Size": "a size (e.g. 512MiB, 10GiB)",
        "Duration": "a duration (e.g. 30s, 5m, 1h)",
        "int": "a whole number",
        "float": "a number",
        "bool": "true or false",
        "tuple[str, ...]": "a list of strings (comma-separated in a variable)",
    }.get(kind, "a string")
