"""Failure modes on hand-built rows (pure), then ``mine`` incrementally on the real Postgres and its report."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from examples.task import MINE_SETTINGS
from onthejob.cli import main
from storage.mine_store import mine as mine_pass
from storage.mine_store import report
from storage.mining import MineConfig, call_modes, grade_modes, tool_errors
from storage.models import CompletionFlag
from tests.storage.rows import choice, feedback_row, insert, new_project, row

DEMO = MINE_SETTINGS  # the demo's text protocol, as project configuration
USER = {"role": "user", "content": "q"}


def reply(
    content: str = "ok",
    *,
    ids: list[int] | None = None,
    finish: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    c = choice(ids if ids is not None else [5, 2], content=content, finish=finish)
    if tool_calls is not None:
        c["message"]["tool_calls"] = tool_calls
    return row(f"c-{uuid.uuid4().hex[:8]}", [1, 2], [c], **kw)


def tool_call(args: str, name: str = "lookup") -> dict[str, Any]:
    return {"id": "t", "type": "function", "function": {"name": name, "arguments": args}}


def modes(r: dict[str, Any], **settings: Any) -> set[str]:
    return set(call_modes(r, MineConfig.from_settings({"mine": settings})))


def test_each_mode_on_a_hand_built_row() -> None:
    assert modes(reply()) == set()
    assert modes({**reply(), "termination": "upstream_error", "status_code": 502, "choices": []}) == {"engine_error"}
    assert modes({**reply(), "termination": "timeout"}) == {"timeout"}
    assert modes({**reply(), "termination": "client_disconnected"}) == {"timeout"}
    assert modes(reply("cut", finish="length")) == {"truncated"}
    assert modes(reply("  ")) == {"empty"}
    assert modes(reply("la", ids=[5, 6, 7, 8] * 10)) == {"repetition"}
    assert modes(reply("", tool_calls=[tool_call("{}")] * 6), tool_burst=5) == {"tool_burst"}
    assert modes(reply("I'm sorry, but I cannot do that.")) == {"refusal"}
    assert modes(reply("", tool_calls=[tool_call("{not json")])) == {"malformed_tool_call"}
    schema = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
    bad = reply("", tool_calls=[tool_call('{"x": 1}')], messages=[USER])
    bad["request"]["tools"] = [schema]
    assert call_modes(bad, MineConfig())["malformed_tool_call"]["error"] == "'q' is a required property"
    good = reply("", tool_calls=[tool_call('{"q": "a"}')], messages=[USER])
    good["request"]["tools"] = [schema]
    assert modes(good) == set()
    assert modes(reply("CALC: twenty*3"), **DEMO) == {"protocol_unparsed"}
    assert modes(reply("CALC: 28*22"), **DEMO) == modes(reply("ANSWER: 616"), **DEMO) == set()
    fmt = {"format_schema": {"type": "object", "required": ["a"]}}
    assert modes(reply("not json"), **fmt) == modes(reply('{"b": 1}'), **fmt) == {"format_violation"}
    assert modes(reply('{"a": 1}'), **fmt) == set()
    assert modes(reply("long", ids=[5, 6, 7, 8, 9]), long_answer_tokens=4) == {"long_answer"}
    cfg = MineConfig.from_settings({"mine": {"low_grade": 0.5}})
    assert set(grade_modes("reward", 0.2, 0.2, cfg)) == {"low_grade"} and grade_modes("reward", 0.9, 0.9, cfg) == {}
    assert set(grade_modes("outcome", "timeout", 0.0, cfg)) == {"timeout"}


def test_tool_errors_are_the_new_tool_results_after_the_last_assistant_turn() -> None:
    cfg = MineConfig.from_settings({"mine": DEMO})
    history = [USER, {"role": "assistant", "content": "CALC: 1/0"}, {"role": "user", "content": "RESULT: error: x"}]
    assert tool_errors(reply(messages=history), cfg) == ["RESULT: error: x"]
    later = [*history, {"role": "assistant", "content": "CALC: 2*3"}, {"role": "user", "content": "RESULT: 6"}]
    assert tool_errors(reply(messages=later), cfg) == []  # the old error is history, not new
    tool = [USER, {"role": "assistant", "content": ""}, {"role": "tool", "content": "Traceback (most recent..."}]
    assert tool_errors(reply(messages=tool), MineConfig()) == ["Traceback (most recent..."]


def test_a_bad_configuration_names_the_key() -> None:
    with pytest.raises(ValueError, match="mine.protocol.line"):
        MineConfig.from_settings({"mine": {"protocol": {"line": "("}}})
    with pytest.raises(ValueError, match="mine.format_schema"):
        MineConfig.from_settings({"mine": {"format_schema": {"type": 5}}})
    with pytest.raises(ValueError, match="mine.protocl is not a setting"):
        MineConfig.from_settings({"mine": {"protocl": {}}})


def test_the_admin_route_checks_the_mine_setting_before_storing_it() -> None:
    from proxy.errors import InvalidRequest
    from proxy.routes_admin import ProjectIn, _checked

    assert _checked(ProjectIn(mine=DEMO)) == {"mine": DEMO}
    with pytest.raises(InvalidRequest, match="mine.long_answer_tokens"):
        _checked(ProjectIn(mine={"long_answer_tokens": "many"}))


def mine(db: Session, project: str) -> Any:
    """A pass that waits long for the horizon (another test run's open transaction may hold it back)."""
    return mine_pass(db, project, settle_s=30)


def _flags(db: Session, project: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = db.execute(
        select(CompletionFlag.completion_id, CompletionFlag.mode, CompletionFlag.detail).where(
            CompletionFlag.project_id == project
        )
    )
    return {(c, m): d for c, m, d in rows}


def test_mine_runs_incrementally_and_reports_per_version(db: Session, pg_url: str, tmp_path: Path) -> None:
    p = new_project(db, {"mine": DEMO})
    first = reply("CALC: 3 apples", project=p, session="a", adapter=1)
    calc = [USER, {"role": "assistant", "content": "CALC: 1/0"}]
    second = reply(
        "ANSWER: 4",
        project=p,
        session="a",
        parent=first["id"],
        adapter=1,
        at=1,
        messages=[*calc, {"role": "user", "content": "RESULT: error: division by zero"}],
    )
    timed = reply("ANSWER: 5", project=p, session="b", adapter=2)
    insert(db, first, second, timed)
    db.add_all([feedback_row(p, "outcome", "timeout", session="b"), feedback_row(p, "reward", 0.0, session="a")])
    db.commit()
    done = mine(db, p)
    assert (done.calls, done.feedback) == (3, 2)
    flags = _flags(db, p)
    assert set(flags) == {
        (first["id"], "protocol_unparsed"),
        (first["id"], "tool_error"),
        (timed["id"], "timeout"),
        (second["id"], "low_grade"),
    }
    assert flags[(first["id"], "protocol_unparsed")] == {"line": "CALC: 3 apples"}

    assert mine(db, p).calls == 0  # nothing changed: nothing read
    third = reply("", project=p, session="c", adapter=2, at=2)
    insert(db, third)
    db.commit()
    again = mine(db, p)
    assert (again.calls, dict(again.flagged)) == (1, {"empty": 1})

    data = report(db, p)
    assert data["calls"] == 4 and data["modes"]["empty"]["count"] == 1
    assert [(v["version"], v["calls"]) for v in data["versions"]] == [(1, 2), (2, 2)]
    assert data["versions"][1]["modes"]["timeout"] == {"count": 1, "share": 0.5}
    assert data["modes"]["tool_error"]["examples"][0]["session_id"] == "a"

    out = tmp_path / "report"
    assert main(["mine", "--project", p, "--db", pg_url, "--out", str(out), "--alias", "agent"]) == 0
    assert json.loads((out / "mine.json").read_text())["modes"]["protocol_unparsed"]["count"] == 1
    assert "| protocol_unparsed | 1 | 25.0% | 50.0% | 0.0% |" in (out / "mine.md").read_text()
    assert (out / "mine.png").stat().st_size > 0


def test_a_pending_grade_flags_its_call_once_it_landed(db: Session) -> None:
    p = new_project(db)
    late = reply("ok", project=p, session="late")
    db.add(feedback_row(p, "thumbs", False, pending_target=("completion_id", late["id"])))
    db.commit()
    assert mine(db, p).unresolved_feedback == 1  # its call has not landed: nothing to flag yet
    insert(db, late)
    db.commit()
    assert dict(mine(db, p).flagged) == {"low_grade": 1}
    assert set(_flags(db, p)) == {(late["id"], "low_grade")}


def test_a_grade_revised_upward_clears_the_low_grade_flag(db: Session) -> None:
    """The newest grade per (source, name) is the call's grade: revised up, the flag goes; down again, it is back."""
    p = new_project(db)
    call, other = reply("ok", project=p, session="a"), reply("ok", project=p, session="b")
    insert(db, call, other)
    db.add_all(
        [
            feedback_row(p, "reward", 0.1, session="a", at=1),  # a session grade: it lands on the session's last call
            feedback_row(p, "thumbs", False, session="b", completion=other["id"], source="human", at=1),
        ]
    )
    db.commit()
    assert dict(mine(db, p).flagged) == {"low_grade": 2}

    up = feedback_row(p, "reward", 0.9, session="a", at=2)
    judge = feedback_row(p, "thumbs", True, session="b", completion=other["id"], source="judge", at=2)
    db.add_all([up, judge])  # b: another source's good grade is not a revision of the human's thumbs down
    db.commit()
    done = mine(db, p)
    assert (done.cleared, dict(done.flagged)) == (1, {})
    assert set(_flags(db, p)) == {(other["id"], "low_grade")}

    down = feedback_row(p, "reward", 0.0, session="a", at=3)
    db.add(down)
    db.commit()
    assert dict(mine(db, p).flagged) == {"low_grade": 1}
    assert _flags(db, p)[(call["id"], "low_grade")]["feedback_id"] == down.id

    # The session goes on; its grade, revised up, lands on the new last call, and the old flag goes too.
    later = reply("ok", project=p, session="a", at=4)
    insert(db, later)
    db.add(feedback_row(p, "reward", 1.0, session="a", at=5))
    db.commit()
    assert mine(db, p).cleared == 1
    assert set(_flags(db, p)) == {(other["id"], "low_grade")}
