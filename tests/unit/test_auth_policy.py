"""IAM policy evaluation: wildcards, explicit deny, Not* elements, and what is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lota.auth.policy import Policy


def policy(*statements: dict[str, Any]) -> Policy:
    return Policy.from_json(json.dumps({"Version": "2012-10-17", "Statement": list(statements)}))


def allow(action: Any, resource: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource}


def deny(action: Any, resource: Any) -> dict[str, Any]:
    return {"Effect": "Deny", "Action": action, "Resource": resource}


OBJ = "arn:aws:s3:::data/train/shard-0001.tar"


def test_exact_action_and_resource() -> None:
    p = policy(allow("s3:GetObject", OBJ))
    assert p.allows("s3:GetObject", OBJ)
    assert not p.allows("s3:PutObject", OBJ)
    assert not p.allows("s3:GetObject", OBJ + "x")
    assert not p.allows("s3:GetObject", "arn:aws:s3:::data/train/shard-0002.tar")


def test_statement_may_be_a_single_object() -> None:
    p = Policy.from_json(json.dumps({"Statement": allow("s3:*", "*")}))
    assert p.allows("s3:DeleteBucket", "arn:aws:s3:::any")


@pytest.mark.parametrize(
    ("pattern", "action", "expected"),
    [
        ("s3:Get*", "s3:GetObject", True),
        ("s3:Get*", "s3:GetObjectVersion", True),
        ("s3:Get*", "s3:PutObject", False),
        ("s3:*", "s3:ListBucket", True),
        ("*", "s3:ListAllMyBuckets", True),
        ("s3:*Object", "s3:DeleteObject", True),
        ("s3:*Object", "s3:DeleteObjectVersion", False),
        ("s3:GetObjec?", "s3:GetObject", True),
        ("s3:GetObjec?", "s3:GetObjects", False),
        # Actions are case-insensitive in IAM.
        ("S3:getobject", "s3:GetObject", True),
        ("s3:GETOBJECT", "s3:getObject", True),
    ],
)
def test_action_wildcards(pattern: str, action: str, expected: bool) -> None:
    assert policy(allow(pattern, "*")).allows(action, OBJ) is expected


@pytest.mark.parametrize(
    ("pattern", "resource", "expected"),
    [
        ("arn:aws:s3:::data/*", OBJ, True),
        ("arn:aws:s3:::data/*", "arn:aws:s3:::data", False),
        ("arn:aws:s3:::data", "arn:aws:s3:::data", True),
        ("arn:aws:s3:::data*", "arn:aws:s3:::database/x", True),
        ("arn:aws:s3:::data/train/*", OBJ, True),
        ("arn:aws:s3:::data/val/*", OBJ, False),
        ("arn:aws:s3:::*/train/*", OBJ, True),
        ("arn:aws:s3:::data/train/shard-000?.tar", OBJ, True),
        ("arn:aws:s3:::data/train/shard-00?.tar", OBJ, False),
        # Resources are case-sensitive.
        ("arn:aws:s3:::DATA/*", OBJ, False),
        ("arn:aws:s3:::data/TRAIN/*", OBJ, False),
        # Keys may hold newlines; * still spans them.
        ("arn:aws:s3:::data/*", "arn:aws:s3:::data/a\nb", True),
    ],
)
def test_resource_wildcards(pattern: str, resource: str, expected: bool) -> None:
    assert policy(allow("s3:GetObject", pattern)).allows("s3:GetObject", resource) is expected


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("arn:aws:s3:::b/a.b", "arn:aws:s3:::b/a.b", "arn:aws:s3:::b/aXb"),
        ("arn:aws:s3:::b/a+", "arn:aws:s3:::b/a+", "arn:aws:s3:::b/aa"),
        ("arn:aws:s3:::b/(x|y)", "arn:aws:s3:::b/(x|y)", "arn:aws:s3:::b/x"),
        ("arn:aws:s3:::b/[ab]", "arn:aws:s3:::b/[ab]", "arn:aws:s3:::b/a"),
        ("arn:aws:s3:::b/^x$", "arn:aws:s3:::b/^x$", "arn:aws:s3:::b/x"),
        ("arn:aws:s3:::b/a{2}", "arn:aws:s3:::b/a{2}", "arn:aws:s3:::b/aa"),
        ("arn:aws:s3:::b/\\d", "arn:aws:s3:::b/\\d", "arn:aws:s3:::b/1"),
        ("arn:aws:s3:::b/.*", "arn:aws:s3:::b/.anything", "arn:aws:s3:::b/anything"),
    ],
)
def test_regex_metacharacters_match_only_themselves(
    pattern: str, matching: str, not_matching: str
) -> None:
    p = policy(allow("s3:GetObject", pattern))
    assert p.allows("s3:GetObject", matching)
    assert not p.allows("s3:GetObject", not_matching)


def test_explicit_deny_wins_over_any_allow() -> None:
    p = policy(
        allow("s3:*", "*"),
        deny("s3:PutObject", "arn:aws:s3:::*/protected/*"),
    )
    assert p.allows("s3:PutObject", "arn:aws:s3:::b/free/x")
    assert not p.allows("s3:PutObject", "arn:aws:s3:::b/protected/x")
    assert p.allows("s3:GetObject", "arn:aws:s3:::b/protected/x")
    # Order does not matter.
    q = policy(deny("s3:PutObject", "arn:aws:s3:::*/protected/*"), allow("s3:*", "*"))
    assert not q.allows("s3:PutObject", "arn:aws:s3:::b/protected/x")


def test_no_matching_allow_is_a_deny() -> None:
    p = policy(allow("s3:GetObject", "arn:aws:s3:::a/*"))
    assert not p.allows("s3:GetObject", "arn:aws:s3:::b/x")
    assert not Policy.deny_all().allows("s3:GetObject", OBJ)
    assert not Policy.deny_all().allows("s3:ListAllMyBuckets", "*")


def test_not_action() -> None:
    p = policy({"Effect": "Allow", "NotAction": ["s3:Delete*", "s3:Put*"], "Resource": "*"})
    assert p.allows("s3:GetObject", OBJ)
    assert not p.allows("s3:DeleteObject", OBJ)
    assert not p.allows("s3:PutBucketPolicy", "arn:aws:s3:::data")


def test_not_resource() -> None:
    p = policy({"Effect": "Allow", "Action": "s3:*", "NotResource": "arn:aws:s3:::secret/*"})
    assert p.allows("s3:GetObject", OBJ)
    assert not p.allows("s3:GetObject", "arn:aws:s3:::secret/k")


def test_deny_with_not_resource_fences_everything_else() -> None:
    p = policy(
        allow("s3:*", "*"),
        {
            "Effect": "Deny",
            "Action": "s3:*",
            "NotResource": ["arn:aws:s3:::mine", "arn:aws:s3:::mine/*"],
        },
    )
    assert p.allows("s3:PutObject", "arn:aws:s3:::mine/x")
    assert not p.allows("s3:PutObject", "arn:aws:s3:::theirs/x")


def test_lists_of_actions_and_resources() -> None:
    p = policy(
        allow(
            ["s3:GetObject", "s3:ListBucket"],
            ["arn:aws:s3:::a", "arn:aws:s3:::a/*", "arn:aws:s3:::b/pub/*"],
        )
    )
    assert p.allows("s3:ListBucket", "arn:aws:s3:::a")
    assert p.allows("s3:GetObject", "arn:aws:s3:::b/pub/x")
    assert not p.allows("s3:GetObject", "arn:aws:s3:::b/priv/x")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"Statement": []}', "Statement"),
        ('{"Statement": [1]}', "must be a JSON object"),
        ('{"Statement": {"Effect": "Allow", "Action": "s3:*"}}', "Resource or NotResource"),
        ('{"Statement": {"Effect": "Allow", "Resource": "*"}}', "Action or NotAction"),
        (
            '{"Statement": {"Effect": "Allow", "Action": "s3:*", "NotAction": "s3:Get*", '
            '"Resource": "*"}}',
            "exactly one",
        ),
        ('{"Statement": {"Effect": "allow", "Action": "s3:*", "Resource": "*"}}', "Effect"),
        ('{"Statement": {"Effect": "Allow", "Action": [], "Resource": "*"}}', "non-empty"),
        ('{"Statement": {"Effect": "Allow", "Action": [3], "Resource": "*"}}', "strings"),
        ('{"Statement": {"Effect": "Allow", "Action": "GetObject", "Resource": "*"}}', "action"),
        (
            '{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", '
            '"Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}}',
            "Condition is not supported",
        ),
        (
            '{"Statement": {"Effect": "Allow", "Principal": "*", "Action": "s3:*", '
            '"Resource": "*"}}',
            "Principal",
        ),
        (
            '{"Statement": {"Effect": "Allow", "Action": "s3:*", '
            '"Resource": "arn:aws:s3:::b/${aws:username}/*"}}',
            "policy variables",
        ),
        ('{"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "X": 1}}', "X"),
        ('{"Version": "2020-01-01", "Statement": {}}', "Version"),
        ('{"Statment": []}', "Statment"),
    ],
)
def test_bad_policies_are_refused_with_a_clear_message(document: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy.from_json(document)


_NAME = st.text(alphabet="ab/.*+?()[]^$|\\", max_size=8)


@given(key=_NAME)
def test_a_literal_resource_matches_exactly_itself(key: str) -> None:
    """Property: a pattern without wildcards matches only the identical resource."""
    literal = key.replace("*", "").replace("?", "")
    p = policy(allow("s3:GetObject", f"arn:aws:s3:::b/{literal}" if literal else "arn:aws:s3:::b"))
    target = f"arn:aws:s3:::b/{literal}" if literal else "arn:aws:s3:::b"
    assert p.allows("s3:GetObject", target)
    assert not p.allows("s3:GetObject", target + "x")
    assert not p.allows("s3:GetObject", "x" + target)
