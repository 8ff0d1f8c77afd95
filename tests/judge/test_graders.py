"""Eval graders on hand-made replies, and eval sets read from JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge.evaluate import EvalResult, EvalSpec, load_set, table
from judge.graders import EvalItem, GraderError, exact, grader_for, json_schema, numeric, regex


def _item(**kw: object) -> EvalItem:
    return EvalItem("i", [{"role": "user", "content": "q"}], **kw)  # type: ignore[arg-type]


def test_builtin_graders() -> None:
    assert exact(_item(reference="42"), " 42\n") == 1.0 and exact(_item(reference="42"), "42.") == 0.0
    assert regex(_item(reference=r"ANSWER: \d+"), "so ANSWER: 7") == 1.0 and regex(_item(reference="x"), "y") == 0.0
    assert numeric(_item(reference=1234), "it is 1,234") == 1.0
    assert numeric(_item(reference=3.5), "3 then 3.50") == 1.0 and numeric(_item(reference=3), "none") == 0.0
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    assert json_schema(_item(schema=schema), 'here: {"a": 1} done') == 1.0
    assert json_schema(_item(schema=schema), '{"a": "1"}') == 0.0 and json_schema(_item(schema=schema), "no") == 0.0
    with pytest.raises(GraderError, match="needs a 'reference'"):
        exact(_item(), "x")


def test_callable_grader_and_unknown_names() -> None:
    grade = grader_for("tests.judge.test_graders:_length_grader")
    assert grade(_item(), "abcd") == 0.4
    with pytest.raises(GraderError, match="cannot import"):
        grader_for("tests.judge.nope:f")
    with pytest.raises(GraderError, match="use exact, regex"):
        grader_for("fuzzy")


def _length_grader(item: EvalItem, reply: str) -> float:
    return len(reply) / 10


def test_eval_sets_take_prompts_or_messages_and_unique_ids(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "2+2?", "reference": "4"})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "hi"}], "note": 1})
        + "\n"
    )
    items = load_set(path)
    assert [(i.id, i.messages[0]["content"], i.reference, i.meta) for i in items] == [
        ("a", "2+2?", "4", {}),
        ("3", "hi", None, {"note": 1}),
    ]
    path.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n" + json.dumps({"id": "a", "prompt": "y"}) + "\n")
    with pytest.raises(GraderError, match="ids repeat"):
        load_set(path)


def test_result_statistics_and_table() -> None:
    result = EvalResult(EvalSpec("a", 2, "http://p", None), scores={"x": 1.0, "y": 0.0, "z": 1.0, "w": 0.0})
    assert (result.n, result.mean) == (4, 0.5) and result.stderr == pytest.approx((1 / 3 / 4) ** 0.5)
    common = {"name": "s", "n": 4, "grader": "exact", "source": "x"}
    rows = [
        {**common, "version": None, "mean": 0.25, "stderr": 0.1},
        {**common, "version": 2, "mean": 0.5, "stderr": 0.2},
    ]
    lines = table(rows, "s").splitlines()
    assert lines[1].split()[:3] == ["base", "4", "0.250"] and lines[2].split()[:3] == ["v2", "4", "0.500"]


def _episodes(spec: EvalSpec) -> dict[str, float]:
    """A harness's own episodes against ``spec.model``: here, one score per item up to ``limit``."""
    return {f"{spec.model}-{i}": 1.0 - i / 10 for i in range(spec.limit or 0)}


def test_an_episodes_eval_takes_its_scores_from_the_harness_function() -> None:
    from judge.evaluate import evaluate, spec_from_policy

    config = {"name": "support", "episodes": "tests.judge.test_graders:_episodes", "limit": 3, "concurrency": 8}
    spec = spec_from_policy(config, alias="a", version=2, proxy="http://x", key=None, post=False)
    assert spec.concurrency == 8 and spec.set_path is None
    result, answer = evaluate(spec)
    assert answer is None and result.scores == {"a@v2-0": 1.0, "a@v2-1": 0.9, "a@v2-2": 0.8}
    assert result.payload()["name"] == "support" and result.n == 3
    with pytest.raises(GraderError, match="scored no item"):
        evaluate(spec_from_policy({**config, "limit": 0}, alias="a", version=2, proxy="http://x", key=None, post=False))
    with pytest.raises(GraderError, match="tests.judge.nope:f"):
        evaluate(
            spec_from_policy({**config, "episodes": "tests.judge.nope:f"}, alias="a", version=2, proxy="", key=None)
        )
    with pytest.raises(GraderError, match="neither 'set'"):
        spec_from_policy({"name": "x"}, alias="a", version=2, proxy="", key=None)
