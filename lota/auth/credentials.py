"""Who may call LOTA: principals, their secret keys and their policies, from a TOML file.

The credentials file lists one ``[[principal]]`` table per identity::

    [[principal]]
    name = "trainer"
    access_key_id = "AKIATRAINER"
    secret_access_key = "..."
    policy = '''
    {"Version": "2012-10-17",
     "Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                    "Resource": "arn:aws:s3:::datasets/*"}]}
    '''

``policy`` is an IAM JSON document (a string, or the same structure written as a TOML
table). A principal without a policy may authenticate but is denied everything, so a
forgotten policy fails closed. Every problem is a :class:`~lota.errors.ConfigError` naming
the file, the principal and what is wrong. :func:`write_new` starts a file with one
principal allowed everything (``lota credentials new FILE``).
"""

from __future__ import annotations

import json
import os
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lota.auth.policy import Policy
from lota.errors import ConfigError

_FIELDS = frozenset({"name", "access_key_id", "secret_access_key", "policy"})
_REQUIRED = ("name", "access_key_id", "secret_access_key")


@dataclass(frozen=True, slots=True)
class Principal:
    """An identity that signs requests, and what it is allowed to do."""

    name: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    policy: Policy


class CredentialStore:
    """Principals by access key id. Immutable once built; load a new one to reload."""

    __slots__ = ("_by_key",)

    def __init__(self, principals: Iterable[Principal]) -> None:
        by_key: dict[str, Principal] = {}
        for principal in principals:
            if principal.access_key_id in by_key:
                raise ConfigError(f"duplicate access key id {principal.access_key_id!r}")
            by_key[principal.access_key_id] = principal
        self._by_key = by_key

    @classmethod
    def load(cls, path: str | Path) -> CredentialStore:
        """Read and validate a credentials file (the only file I/O in :mod:`lota.auth`)."""
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read credentials file {path}: {exc}") from exc
        unknown = set(document) - {"principal"}
        if unknown:
            raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}")
        tables = document.get("principal", [])
        if not isinstance(tables, list):
            raise ConfigError(f"{path}: principals must be [[principal]] tables")
        principals = [_principal(path, index, table) for index, table in enumerate(tables)]
        _check_unique(path, principals)
        return cls(principals)

    def get(self, access_key_id: str) -> Principal | None:
        return self._by_key.get(access_key_id)

    def __len__(self) -> int:
        return len(self._by_key)


def _principal(path: str | Path, index: int, table: Any) -> Principal:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: principal #{index + 1} is not a table")
    who = f"{path}: principal {table.get('name') or f'#{index + 1}'!s}"
    unknown = set(table) - _FIELDS
    if unknown:
        raise ConfigError(f"{who}: unknown field(s) {', '.join(sorted(unknown))}")
    for name in _REQUIRED:
        if not isinstance(table.get(name), str) or not table[name]:
            raise ConfigError(f"{who}: missing or empty {name}")
    if "/" in table["access_key_id"] or not table["access_key_id"].isprintable():
        raise ConfigError(f"{who}: access_key_id must be printable and contain no '/'")
    return Principal(
        name=table["name"],
        access_key_id=table["access_key_id"],
        secret_access_key=table["secret_access_key"],
        policy=_policy(who, table.get("policy")),
    )


def _policy(who: str, raw: Any) -> Policy:
    if raw is None:
        return Policy.deny_all()
    text = json.dumps(raw) if isinstance(raw, Mapping) else raw
    if not isinstance(text, str):
        raise ConfigError(f"{who}: policy must be an IAM JSON string or a table")
    try:
        return Policy.from_json(text)
    except ValueError as exc:
        raise ConfigError(f"{who}: invalid policy: {exc}") from exc


def _check_unique(path: str | Path, principals: list[Principal]) -> None:
    keys: dict[str, str] = {}
    names: set[str] = set()
    for p in principals:
        if p.access_key_id in keys:
            raise ConfigError(
                f"{path}: principal {p.name}: access key id {p.access_key_id!r} "
                f"is already used by principal {keys[p.access_key_id]}"
            )
        if p.name in names:
            raise ConfigError(f"{path}: principal {p.name}: duplicate principal name")
        keys[p.access_key_id] = p.name
        names.add(p.name)


_ALLOW_ALL = '{"Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'


def write_new(path: str | Path, name: str = "admin") -> Principal:
    """A new credentials file at `path` (mode 0600) with one principal allowed everything,
    under a fresh key pair; an existing file is never overwritten."""
    principal = Principal(
        name=name,
        access_key_id="LOTA" + secrets.token_hex(8).upper(),
        secret_access_key=secrets.token_urlsafe(30),
        policy=Policy.from_json(_ALLOW_ALL),
    )
    text = (
        "# Client credentials for LOTA: one [[principal]] per identity, each with an IAM policy.\n"
        "[[principal]]\n"
        f"name = {json.dumps(name)}\n"
        f'access_key_id = "{principal.access_key_id}"\n'
        f'secret_access_key = "{principal.secret_access_key}"\n'
        f"policy = '{_ALLOW_ALL}'\n"
    )
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists already; LOTA does not overwrite credentials") from None
    except OSError as exc:
        raise ConfigError(f"cannot create credentials file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return principal
