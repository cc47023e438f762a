"""Lifecycle rules and the plan, without I/O."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lota.catalog import AccessRecord
from lota.errors import ConfigError
from lota.lifecycle.config import LifecycleConfig, from_toml, rules_from_data
from lota.lifecycle.rules import (
    DAY,
    Decision,
    ObjectInfo,
    Rule,
    Tiers,
    Transition,
    child_of,
    explain,
    listing_prefix,
    needs_tags,
    plan,
    splits_directory,
)
from lota.lifecycle.state import LifecycleState

NOW = 1_900_000_000.0
KiB = 1024
TIERS = Tiers()
ARCHIVE_60 = (Transition(60, "archive"),)


def obj(key: str, *, age: float = 100, size: int = 128 * KiB, cls: str = "STANDARD") -> ObjectInfo:
    """An object last written `age` days before NOW."""
    return ObjectInfo("ckpt", key, size, NOW - age * DAY, cls, f'"{key}"')


def read(key: str, days_ago: float, tier: str | None = None) -> dict[tuple[str, str], AccessRecord]:
    return {
        ("ckpt", key): AccessRecord(
            bucket="ckpt", key=key, last_access=NOW - days_ago * DAY, tier=tier
        )
    }


def moved(decisions: list[Decision]) -> dict[str, str]:
    return {d.key: d.to_tier for d in decisions}


def test_glob_star_matches_within_one_segment_only() -> None:
    rule = Rule(bucket="ckpt", prefix="runs/*/", transitions=ARCHIVE_60)
    assert rule.directory("ckpt", "runs/a/step-1/model.pt") == "runs/a/"
    assert rule.directory("ckpt", "runs/a-b.c/x") == "runs/a-b.c/"
    assert rule.directory("ckpt", "runs/x.pt") is None  # no second segment
    assert rule.directory("ckpt", "runsx/a/x") is None
    assert rule.directory("other", "runs/a/x") is None
    mid = Rule(bucket="ckpt", prefix="runs/*/ckpt-*/", transitions=ARCHIVE_60)
    assert mid.directory("ckpt", "runs/a/ckpt-7/shard") == "runs/a/ckpt-7/"
    assert mid.directory("ckpt", "runs/a/b/ckpt-7/shard") is None
    literal = Rule(bucket="ckpt", prefix="data.v1/", transitions=ARCHIVE_60)
    assert literal.directory("ckpt", "dataxv1/x") is None  # '.' is not a wildcard
    assert literal.literal_prefix == "data.v1/" and mid.literal_prefix == "runs/"


def test_unread_for_60_days_goes_to_archive_with_a_reason() -> None:
    rule = Rule(bucket="ckpt", prefix="runs/*/", transitions=ARCHIVE_60)
    decisions = plan([obj("runs/a/old.pt", age=61.5)], {}, [rule], TIERS, NOW)
    assert decisions == [
        Decision(
            bucket="ckpt",
            key="runs/a/old.pt",
            size=128 * KiB,
            from_tier="hot",
            to_tier="archive",
            storage_class="DEEP_ARCHIVE",
            reason="unread for 61 days (rule ckpt/runs/*/ -> archive after 60)",
            from_class="STANDARD",
            etag='"runs/a/old.pt"',
            last_access=NOW - 61.5 * DAY,
        )
    ]


def test_a_recorded_read_counts_and_origin_last_modified_counts_too() -> None:
    rule = Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60)
    objects = [obj("read-lately", age=100), obj("written-lately", age=10), obj("stale", age=100)]
    accesses = read("read-lately", 7) | read("written-lately", 90) | read("stale", 70)
    assert moved(plan(objects, accesses, [rule], TIERS, NOW)) == {"stale": "archive"}


def test_objects_under_min_size_never_move() -> None:
    rule = Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60)
    objects = [obj("small", size=128 * KiB - 1, age=400), obj("exact", size=128 * KiB, age=400)]
    assert moved(plan(objects, {}, [rule], TIERS, NOW)) == {"exact": "archive"}
    tiny = Rule(bucket="ckpt", prefix="", min_size=0, transitions=ARCHIVE_60)
    assert len(plan(objects, {}, [tiny], TIERS, NOW)) == 2


def test_the_coldest_due_tier_is_the_target_and_never_past_it() -> None:
    rule = Rule(
        bucket="ckpt",
        prefix="",
        transitions=(Transition(30, "warm"), Transition(90, "archive"), Transition(60, "cold")),
    )
    objects = [obj("d10", age=10), obj("d45", age=45), obj("d75", age=75), obj("d200", age=200)]
    assert moved(plan(objects, {}, [rule], TIERS, NOW)) == {
        "d45": "warm",
        "d75": "cold",
        "d200": "archive",
    }


def test_objects_never_move_up_and_the_plan_is_idempotent() -> None:
    rule = Rule(bucket="ckpt", prefix="", transitions=(Transition(30, "warm"),))
    objects = [
        obj("in-archive", age=100, cls="DEEP_ARCHIVE"),  # rules say warm: no rehydration
        obj("in-warm", age=100, cls="STANDARD_IA"),  # already there
        obj("in-cold-recently-read", age=100, cls="GLACIER_IR"),
    ]
    accesses = read("in-cold-recently-read", 1, tier="cold")
    assert plan(objects, accesses, [rule], TIERS, NOW) == []


def test_an_object_the_engine_moved_ignores_the_copys_last_modified() -> None:
    rule = Rule(
        bucket="ckpt", prefix="", transitions=(Transition(30, "warm"), Transition(60, "archive"))
    )
    # Moved to warm on day 35 (the copy set LastModified then); last read on day 0.
    copied = obj("k", age=25, cls="STANDARD_IA")
    assert moved(plan([copied], read("k", 61, tier="warm"), [rule], TIERS, NOW)) == {"k": "archive"}
    # Rewritten since (class STANDARD again, tier record stale): LastModified counts.
    rewritten = obj("k", age=25)
    assert plan([rewritten], read("k", 61, tier="warm"), [rule], TIERS, NOW) == []


def test_current_tier_follows_the_origin_class_when_tiers_share_a_class() -> None:
    tiers = Tiers(warm="STANDARD")
    rule = Rule(
        bucket="ckpt", prefix="", transitions=(Transition(30, "warm"), Transition(60, "archive"))
    )
    decisions = plan([obj("k", age=40)], {}, [rule], tiers, NOW)
    assert [(d.from_tier, d.to_tier, d.storage_class) for d in decisions] == [
        ("hot", "warm", "STANDARD")
    ]
    assert plan([obj("k", age=40)], read("k", 40, tier="warm"), [rule], tiers, NOW) == []
    assert tiers.current("STANDARD", None) == "hot"
    assert tiers.current("GLACIER", None) is None


def test_an_object_in_a_class_no_tier_names_is_left_alone() -> None:
    rule = Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60)
    assert plan([obj("k", age=400, cls="INTELLIGENT_TIERING")], {}, [rule], TIERS, NOW) == []


def test_first_matching_rule_wins_and_a_rule_without_transitions_pins() -> None:
    rules = [
        Rule(bucket="ckpt", prefix="runs/*/best/"),
        Rule(bucket="ckpt", prefix="runs/", transitions=ARCHIVE_60),
        Rule(bucket="ckpt", prefix="", transitions=(Transition(1, "warm"),)),
    ]
    objects = [obj("runs/a/best/m.pt"), obj("runs/a/step-1/m.pt"), obj("logs/x")]
    assert moved(plan(objects, {}, rules, TIERS, NOW)) == {
        "runs/a/step-1/m.pt": "archive",
        "logs/x": "warm",
    }


def test_keep_latest_keeps_the_newest_children_of_each_matched_directory() -> None:
    rule = Rule(bucket="ckpt", prefix="runs/*/", keep_latest=2, transitions=ARCHIVE_60)
    objects = [
        # runs/a: steps written 100, 90, 80, 70 days ago; step-2 also got a newer shard.
        obj("runs/a/step-1/m.pt", age=100),
        obj("runs/a/step-2/m.pt", age=90),
        obj("runs/a/step-2/opt.pt", age=65),
        obj("runs/a/step-3/m.pt", age=80),
        obj("runs/a/step-4/m.pt", age=70),
        obj("runs/a/notes.txt", age=200, size=1),  # a child too, small: never moves
        # runs/b: a direct object is a child like a sub-directory.
        obj("runs/b/final.pt", age=300),
        obj("runs/b/step-9/m.pt", age=400),
        obj("runs/b/step-8/m.pt", age=500),
    ]
    assert moved(plan(objects, {}, [rule], TIERS, NOW)) == {
        "runs/a/step-1/m.pt": "archive",
        "runs/a/step-3/m.pt": "archive",
        "runs/b/step-8/m.pt": "archive",
    }


def test_keep_latest_ranks_by_writes_not_reads_and_breaks_ties_by_name() -> None:
    rule = Rule(bucket="ckpt", prefix="runs/*/", keep_latest=1, transitions=ARCHIVE_60)
    objects = [obj("runs/a/step-0009/m", age=70), obj("runs/a/step-0010/m", age=70)]
    accesses = read("runs/a/step-0009/m", 61)
    assert moved(plan(objects, accesses, [rule], TIERS, NOW)) == {"runs/a/step-0009/m": "archive"}


def test_keep_latest_does_not_count_checkpoints_the_engine_archived() -> None:
    # step-1 was archived yesterday: its LastModified (the copy) is the newest in the run.
    rule = Rule(bucket="ckpt", prefix="runs/*/", keep_latest=1, transitions=ARCHIVE_60)
    objects = [
        obj("runs/a/step-1/m", age=1, cls="DEEP_ARCHIVE"),
        obj("runs/a/step-2/m", age=80),
        obj("runs/a/step-3/m", age=70),
    ]
    accesses = read("runs/a/step-1/m", 100, tier="archive")
    assert moved(plan(objects, accesses, [rule], TIERS, NOW)) == {"runs/a/step-2/m": "archive"}


def test_keep_latest_at_the_bucket_top_level() -> None:
    rule = Rule(bucket="ckpt", prefix="", keep_latest=1, transitions=ARCHIVE_60)
    objects = [obj("a/x", age=90), obj("b/x", age=80), obj("c", age=70)]
    assert moved(plan(objects, {}, [rule], TIERS, NOW)) == {"a/x": "archive", "b/x": "archive"}
    assert child_of("", "a/x/y") == "a/" and child_of("runs/a/", "runs/a/f.pt") == "f.pt"


def test_page_boundaries_never_split_a_keep_latest_directory() -> None:
    rules = [Rule(bucket="ckpt", prefix="runs/*/", keep_latest=3, transitions=ARCHIVE_60)]
    assert splits_directory(rules, "ckpt", "runs/a/step-1/m", "runs/a/step-2/m")
    assert not splits_directory(rules, "ckpt", "runs/a/step-9/m", "runs/b/step-1/m")
    assert not splits_directory(rules, "ckpt", "data/1", "data/2")
    plain = [Rule(bucket="ckpt", prefix="runs/*/", transitions=ARCHIVE_60)]
    assert not splits_directory(plain, "ckpt", "runs/a/1", "runs/a/2")


def test_listing_prefix_is_what_every_rule_of_the_bucket_shares() -> None:
    def rule(prefix: str, bucket: str = "ckpt") -> Rule:
        return Rule(bucket=bucket, prefix=prefix, transitions=ARCHIVE_60)

    assert listing_prefix([rule("runs/*/"), rule("runs/x/")], "ckpt") == "runs/"
    assert listing_prefix([rule("runs/*/"), rule("data/"), rule("z", "other")], "ckpt") == ""
    assert listing_prefix([rule("z", "other")], "ckpt") == ""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"bucket": "Bad_Bucket"}, "not a valid bucket"),
        ({"bucket": "ckpt", "prefix": "/x"}, "must not start"),
        ({"bucket": "ckpt", "prefix": "runs/*", "keep_latest": 3}, "ends in '/'"),
        ({"bucket": "ckpt", "transitions": [{"days_since_last_access": 5, "tier": "hot"}]}, "warm"),
        ({"bucket": "ckpt", "transitions": [{"days_since_last_access": 5, "tier": "x"}]}, "warm"),
        (
            {
                "bucket": "ckpt",
                "transitions": [
                    {"days_since_last_access": 30, "tier": "archive"},
                    {"days_since_last_access": 60, "tier": "warm"},
                ],
            },
            "colder",
        ),
        ({"bucket": "ckpt", "transitions": [{"days": 5, "tier": "warm"}]}, "days_since"),
        ({"bucket": "ckpt", "min_size": "lots"}, "not a size"),
        ({"bucket": "ckpt", "keep_latest": "3"}, "whole number"),
        ({"bucket": "ckpt", "tags": {"stage": 1}}, "table of strings"),
        ({"bucket": "ckpt", "tag": {"stage": "final"}}, "unknown setting"),
    ],
)
def test_bad_rules_are_refused_with_a_reason(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rules_from_data([data])


def test_the_lifecycle_section_parses_with_defaults() -> None:
    assert LifecycleConfig().tiers == Tiers(
        hot="STANDARD", warm="STANDARD_IA", cold="GLACIER_IR", archive="DEEP_ARCHIVE"
    )
    config = from_toml(
        {
            "interval": "0",
            "rate": 50,
            "tiers": {"archive": "GLACIER"},
            "rules": [
                {
                    "bucket": "ckpt",
                    "prefix": "runs/*/",
                    "min_size": "1MiB",
                    "keep_latest": 3,
                    "transitions": [{"days_since_last_access": 60, "tier": "archive"}],
                }
            ],
        }
    )
    assert config.interval == 0 and config.rate == 50
    assert config.tiers.archive == "GLACIER" and config.tiers.warm == "STANDARD_IA"
    assert config.rules == (
        Rule(bucket="ckpt", prefix="runs/*/", min_size=1024 * KiB, keep_latest=3,
             transitions=ARCHIVE_60),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="unknown setting"):
        from_toml({"intervall": "1h"})
    with pytest.raises(ConfigError, match="unknown tier"):
        from_toml({"tiers": {"lukewarm": "STANDARD"}})


async def test_rules_are_replaced_at_runtime_only_when_valid() -> None:
    state = LifecycleState(rules_from_data([{"bucket": "ckpt"}]))
    new = await state.replace(
        b'{"rules": [{"bucket": "data", "prefix": "raw/", '
        b'"transitions": [{"days_since_last_access": 60, "tier": "archive"}]}]}'
    )
    assert [r.name for r in new] == ["data/raw/"] and state.rules == new
    for bad in (b"not json", b'[{"bucket": "data", "keep_latest": -1}]', b'{"rulez": []}'):
        with pytest.raises(ConfigError):
            await state.replace(bad)
    assert state.rules == new and state.version == 1
    assert LifecycleState(rules_from_data(json.loads(state.as_json())["rules"])).rules == new


def test_a_tag_filtered_rule_governs_only_the_objects_carrying_all_its_tags() -> None:
    final = Rule(
        bucket="ckpt",
        prefix="runs/",
        tags=(("stage", "final"), ("team", "a")),
        transitions=(Transition(30, "cold"),),
    )
    rest = Rule(bucket="ckpt", prefix="runs/", transitions=(Transition(90, "archive"),))
    tagged = [
        replace(obj("runs/1", age=40), tags={"stage": "final", "team": "a", "x": "y"}),
        replace(obj("runs/2", age=40), tags={"stage": "final"}),
        replace(obj("runs/3", age=100), tags={}),
    ]
    assert moved(plan(tagged, {}, [final, rest], Tiers(), NOW)) == {
        "runs/1": "cold",
        "runs/3": "archive",
    }
    assert needs_tags(obj("runs/x"), [final, rest]) and not needs_tags(obj("other"), [final])
    assert not needs_tags(obj("runs/x"), [rest, final])  # a tagless rule matches first
    assert rules_from_data([{"bucket": "ckpt", "tags": {"stage": "final"}}])[0].as_dict()[
        "tags"
    ] == {"stage": "final"}


def test_status_says_which_rule_moves_an_object_where_and_when_or_why_never() -> None:
    rule = Rule(bucket="ckpt", prefix="runs/", transitions=(Transition(60, "archive"),))
    status = explain(obj("runs/a", age=10), None, [rule], Tiers(), NOW)
    assert (status.tier, status.rule, status.next_tier) == ("hot", "ckpt/runs/", "archive")
    assert status.due_at == NOW + 50 * DAY
    due = explain(obj("runs/a", age=100), None, [rule], Tiers(), NOW)
    assert due.due_at is not None and due.due_at <= NOW
    usage = read("runs/a", days_ago=5)[("ckpt", "runs/a")]
    assert explain(obj("runs/a", age=100), usage, [rule], Tiers(), NOW).due_at == NOW + 55 * DAY
    assert "never moves" in explain(obj("other"), None, [rule], Tiers(), NOW).note
    assert "min_size" in explain(obj("runs/s", size=10), None, [rule], Tiers(), NOW).note
    done = explain(obj("runs/d", cls="DEEP_ARCHIVE"), None, [rule], Tiers(), NOW)
    assert done.tier == "archive" and not done.next_tier
