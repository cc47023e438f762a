"""The credentials file: principals, their policies, and the errors a typo gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.errors import ConfigError

READER = '{"Statement":[{"Effect":"Allow","Action":["s3:Get*","s3:List*"],"Resource":"*"}]}'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "credentials.toml"
    path.write_text(text)
    return path


def test_load_principals_with_policies(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
[[principal]]
name = "reader"
access_key_id = "AKIAREADER"
secret_access_key = "reader-secret"
policy = '{READER}'

[[principal]]
name = "tabled"
access_key_id = "AKIATABLED"
secret_access_key = "tabled-secret"
[principal.policy]
Version = "2012-10-17"
Statement = [{{Effect = "Allow", Action = "s3:PutObject", Resource = "arn:aws:s3:::up/*"}}]
""",
    )
    store = CredentialStore.load(path)
    assert len(store) == 2
    reader = store.get("AKIAREADER")
    assert reader is not None
    assert reader.name == "reader"
    assert reader.secret_access_key == "reader-secret"
    assert reader.policy.allows("s3:GetObject", "arn:aws:s3:::any/key")
    assert not reader.policy.allows("s3:PutObject", "arn:aws:s3:::any/key")
    tabled = store.get("AKIATABLED")
    assert tabled is not None
    assert tabled.policy.allows("s3:PutObject", "arn:aws:s3:::up/x")
    assert store.get("AKIAOTHER") is None


def test_a_principal_without_policy_is_denied_everything(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[[principal]]\nname = "nobody"\naccess_key_id = "AK"\nsecret_access_key = "s"\n',
    )
    principal = CredentialStore.load(path).get("AK")
    assert principal is not None
    assert not principal.policy.allows("s3:GetObject", "arn:aws:s3:::b/k")
    assert not principal.policy.allows("s3:ListAllMyBuckets", "*")


def test_the_secret_never_shows_in_repr() -> None:
    principal = Principal("p", "AK", "very-secret", Policy.deny_all())
    assert "very-secret" not in repr(principal)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK"\nsecret_access_key = "s"\n'
            '[[principal]]\nname = "b"\naccess_key_id = "AK"\nsecret_access_key = "t"\n',
            "principal b: access key id 'AK' is already used by principal a",
        ),
        ('[[principal]]\nname = "a"\nsecret_access_key = "s"\n', "principal a: missing"),
        ('[[principal]]\nname = "a"\naccess_key_id = "AK"\n', "secret_access_key"),
        ('[[principal]]\naccess_key_id = "AK"\nsecret_access_key = "s"\n', "#1: missing"),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK"\nsecret_access_key = ""\n',
            "empty secret_access_key",
        ),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK"\nsecret_access_key = "s"\n'
            "policy = '{\"Statement\": []}'\n",
            "principal a: invalid policy",
        ),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK"\nsecret_access_key = "s"\n'
            'policy = \'{"Statement": {"Effect": "Allow", "Action": "s3:*", '
            '"Resource": "*", "Condition": {}}}\'\n',
            "Condition is not supported",
        ),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK"\nsecret_access_key = "s"\n'
            'secret = "typo"\n',
            "unknown field",
        ),
        ('[[principle]]\nname = "a"\n', "unknown table"),
        ("[[principal]\n", "cannot read"),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "A/K"\nsecret_access_key = "s"\n',
            "no '/'",
        ),
        (
            '[[principal]]\nname = "a"\naccess_key_id = "AK1"\nsecret_access_key = "s"\n'
            '[[principal]]\nname = "a"\naccess_key_id = "AK2"\nsecret_access_key = "s"\n',
            "duplicate principal name",
        ),
    ],
)
def test_problems_name_the_file_the_principal_and_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        CredentialStore.load(path)
    assert str(path) in str(info.value)
    assert problem in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read credentials file"):
        CredentialStore.load(tmp_path / "nope.toml")


def test_store_built_in_code_rejects_duplicate_keys() -> None:
    principals = [Principal(n, "AK", "s", Policy.deny_all()) for n in ("a", "b")]
    with pytest.raises(ConfigError, match="duplicate access key"):
        CredentialStore(principals)
