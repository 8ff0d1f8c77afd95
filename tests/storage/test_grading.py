"""Grading: the default reward rule and its configuration, on hand-built trajectories and feedback;
target resolution, winners and exclusions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from storage.grading import (
    DEFAULT_RULE,
    MASKED,
    Exclusion,
    RewardRule,
    Targets,
    apply_rewards,
    current,
    newest,
    resolve_reward,
    to_grade,
    training_exclusion,
)
from storage.trajectories import Trajectory
from tests.storage.rows import T0


def traj(*calls: str, flags: list[str] | None = None, session: str = "s1") -> Trajectory:
    return Trajectory(
        id=f"{calls[-1]}:0",
        project_id="p",
        session_id=session,
        task_id=None,
        alias="a",
        token_ids=[1, 2],
        mask=[0, 1],
        logprobs=[None, -0.1],
        turns=[],
        completion_ids=list(calls),
        flags=flags or [],
    )


_n = iter(range(10_000))


def fb(
    name: str,
    value: Any = None,
    *,
    on: str | None = None,
    session: str | None = "s1",
    source: str = "",
    at: int = 0,
    comment: str | None = None,
) -> dict[str, Any]:
    """A resolved feedback row: about completion ``on``, else about the session."""
    return {
        "id": f"fb-{next(_n):04d}",
        "completion_id": on,
        "session_id": session,
        "name": name,
        "value": value,
        "comment": comment,
        "source": source,
        "created_at": T0 + timedelta(seconds=at),
    }


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("reward", 0.25, 0.25),
        ("reward", -3, -3.0),
        ("thumbs", True, 1.0),
        ("thumbs", False, -1.0),
        ("outcome", "success", 1.0),
        ("outcome", "failure", 0.0),
        ("outcome", "timeout", 0.0),
        ("outcome", "Abort", 0.0),
        ("outcome", "infra_error", MASKED),
        ("outcome", "partial", None),
        ("reward", True, None),
        ("thumbs", 1, None),
        ("comment", "meh", None),
    ],
)
def test_default_scores(name: str, value: Any, expected: Any) -> None:
    assert DEFAULT_RULE.score(name, value) == expected


def test_session_level_feedback_wins_over_completion_level() -> None:
    reward, detail = resolve_reward(traj("c1", "c2"), [fb("reward", 0.9, on="c2"), fb("thumbs", False)])
    assert reward == -1.0
    assert (detail["scope"], detail["name"], detail["source"], detail["reward"]) == ("session", "thumbs", "", -1.0)
    assert len(detail["candidates"]) == 2


def test_else_the_last_graded_completion_of_the_trajectory() -> None:
    items = [fb("reward", 0.2, on="c1"), fb("reward", 0.7, on="c2"), fb("reward", 1.0, on="other")]
    reward, detail = resolve_reward(traj("c1", "c2", "c3"), items)
    assert (reward, detail["completion_id"], detail["scope"]) == (0.7, "c2", "completion")


def test_newest_revision_from_the_same_source_and_name_wins() -> None:
    items = [fb("reward", 0.1, source="grader", at=5), fb("reward", 0.8, source="grader", at=1)]
    assert resolve_reward(traj("c1"), items)[0] == 0.1
    assert [g.value for g in current(to_grade(i) for i in items)] == [0.1]
    # Two sources: both current; the priority of names decides, then the newest.
    items += [fb("outcome", "failure", source="harness", at=9), fb("reward", 0.5, source="human", at=7)]
    reward, detail = resolve_reward(traj("c1"), items)
    assert (reward, detail["source"]) == (0.5, "human")


def test_no_grade_or_comments_only_is_excluded_never_zero() -> None:
    for items in ([], [fb("comment", comment="too long")], [fb("outcome", "partial")]):
        reward, detail = resolve_reward(traj("c1"), items)
        assert reward is None and detail["excluded"] == "ungraded"
    other_session = [fb("reward", 1.0, session="s2")]
    assert resolve_reward(traj("c1"), other_session)[0] is None


def test_infra_errors_are_masked() -> None:
    reward, detail = resolve_reward(traj("c1"), [fb("outcome", "infra_error"), fb("reward", 1.0, on="c1")])
    assert (reward, detail["excluded"], detail["by"]["name"]) == (None, "infra_error", "outcome")
    reward, detail = resolve_reward(traj("c1", flags=["upstream_error"]), [fb("outcome", "success")])
    assert (reward, detail["excluded"], detail["termination"]) == (None, "infra_error", "upstream_error")


def test_proxy_seen_timeouts_and_disconnects_are_failures() -> None:
    for flag in ("timeout", "client_disconnected"):
        reward, detail = resolve_reward(traj("c1", "c2", flags=[flag]), [fb("outcome", "success")])
        assert (reward, detail["scope"], detail["termination"]) == (0.0, "proxy", flag)
    # ... unless the call that was cut short carries its own grade.
    reward, _ = resolve_reward(traj("c1", "c2", flags=["timeout"]), [fb("reward", 0.4, on="c2")])
    assert reward == 0.4


def test_harness_reported_timeout_is_a_failure() -> None:
    assert resolve_reward(traj("c1"), [fb("outcome", "timeout")])[0] == 0.0


def test_configured_rule() -> None:
    rule = RewardRule.from_config(
        {
            "numeric": ["score"],
            "labels": {"outcome": {"partial": 0.5}, "verdict": {"ok": 1, "bad": -1}},
            "booleans": {"liked": [2, 0]},
            "priority": ["verdict", "score"],
        }
    )
    assert rule.score("score", 3) == 3.0 and rule.score("reward", 3) is None
    assert rule.score("outcome", "partial") == 0.5 and rule.score("outcome", "success") == 1.0
    assert rule.score("liked", True) == 2.0 and rule.score("thumbs", True) == 1.0
    assert resolve_reward(traj("c1"), [fb("score", 0.3), fb("verdict", "bad")], rule)[0] == -1.0


def test_a_comment_alone_gives_no_scalar() -> None:
    """The rule's judge callable is gone: a judge posts its grades as feedback (tests/storage/test_judge_grades.py)."""
    reward, detail = resolve_reward(traj("c1"), [fb("comment", comment="great job")])
    assert reward is None and detail["excluded"] == "ungraded"


def test_apply_rewards_fills_every_trajectory() -> None:
    ts = [traj("c1"), traj("c2", session="s2")]
    apply_rewards(ts, [fb("thumbs", True)])
    assert [t.reward for t in ts] == [1.0, None]
    assert ts[1].reward_detail["excluded"] == "ungraded"


# --------------------------------------------------------------------------- targets, winners, exclusions


@dataclass
class CallStub:
    id: str
    session_id: str
    client_request_id: str | None
    created_at: datetime


def test_targets_one_rule_a_reused_client_request_id_names_its_newest_call() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    calls = [
        CallStub("c2", "s1", "req", t0 + timedelta(seconds=2)),
        CallStub("c1", "s1", "req", t0),
        CallStub("c3", "s2", None, t0 + timedelta(seconds=1)),
    ]
    targets = Targets(calls)
    assert targets.resolve("client_request_id", "req") == ("c2", "s1")
    assert targets.resolve("completion_id", "c3") == ("c3", "s2")
    assert targets.resolve("session_id", "s2") == (None, "s2")
    assert targets.resolve("session_id", "s9") == targets.resolve("completion_id", "c9") == (None, None)
    assert Targets((), ["s9"]).resolve("session_id", "s9") == (None, "s9")  # a session known without its calls


def test_newest_per_key_wins_ties_broken_by_id() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    items = [CallStub("b", "k", None, t0), CallStub("a", "k", None, t0), CallStub("c", "j", None, t0)]
    assert [i.id for i in newest(items, lambda i: i.session_id)] == ["b", "c"]


def test_no_sampled_tokens_is_one_rule_for_storage_and_trainer() -> None:
    from tests.trainer.helpers import make_trajectory
    from trainer.batch import screen

    # Only the very first token sampled: nothing predicts it, so neither side trains on it
    # (storage used to pass it on with any(mask) and the trainer then dropped it with mask[1:]).
    first_only = make_trajectory("first", [], [7])
    first_only.token_ids, first_only.mask, first_only.logprobs = [7, 8], [1, 0], [-1.0, None]
    assert training_exclusion(first_only, used=()) == Exclusion.NO_SAMPLED_TOKENS
    assert screen([first_only], max_len=10)[1] == {"first": Exclusion.NO_SAMPLED_TOKENS}
    assert training_exclusion(make_trajectory("ok", [1], [7]), used=()) is None


def test_exclusions_are_the_strings_counted_and_stored() -> None:
    reward, detail = resolve_reward(traj("c1"), [])
    assert reward is None and detail["excluded"] == "ungraded" == Exclusion.UNGRADED
    assert Exclusion("infra_error") is Exclusion.INFRA_ERROR
