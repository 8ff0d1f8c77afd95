"""Feedback validation: every refusal names the field and the fix; a bad item refuses the batch."""

from __future__ import annotations

from typing import Any

import pytest

from storage.feedback_input import MAX_COMMENT_BYTES, FeedbackInputError, parse_feedback

OK = {"target": {"completion_id": "cmpl-1"}, "name": "thumbs", "value": True}


def test_accepts_one_item_and_both_batch_forms() -> None:
    [item], batch = parse_feedback(OK)
    assert not batch and (item.target.kind, item.target.id, item.value) == ("completion_id", "cmpl-1", True)
    comment_only = {"target": {"session_id": "s"}, "name": "review", "comment": "too verbose", "source": "human"}
    items, batch = parse_feedback({"feedback": [OK, comment_only]})
    assert batch and [i.target.kind for i in items] == ["completion_id", "session_id"]
    labelled = {"target": {"client_request_id": "r"}, "name": "outcome", "value": "success", "id": "k"}
    assert parse_feedback([labelled, {**OK, "value": 0.5}])[0][0].id == "k"


def test_a_correction_is_text_in_the_comment() -> None:
    items, _ = parse_feedback({"target": {"completion_id": "c"}, "name": "correction", "comment": "ANSWER: 5"})
    assert (items[0].name, items[0].value, items[0].comment) == ("correction", None, "ANSWER: 5")


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"target": {"completion_id": "c"}, "name": "x"}, "value", "give a value"),
        ({"target": {"completion_id": "c"}, "name": "x", "comment": "  "}, "value", "give a value"),
        ({**OK, "value": [1]}, "value", "number, a boolean or a string"),
        ({**OK, "value": {"a": 1}}, "value", "put structured data in metadata"),
        ({**OK, "value": float("nan")}, "value", "finite"),
        ({**OK, "target": {"completion_id": "c", "session_id": "s"}}, "target", "exactly one"),
        ({**OK, "target": {}}, "target", "exactly one"),
        ({**OK, "target": {"completion": "c"}}, "target.completion", "completion_id, session_id, client_request_id"),
        ({**OK, "target": "cmpl-1"}, "target", "JSON object"),
        ({**OK, "target": {"completion_id": 7}}, "target.completion_id", "must be a string"),
        ({**OK, "comment": "x" * (MAX_COMMENT_BYTES + 1)}, "comment", "16384-byte limit"),
        ({"target": {"completion_id": "c"}, "value": 1}, "name", "is required"),
        ({"name": "x", "value": 1}, "target", "is required"),
        ({**OK, "name": ""}, "name", "at least 1 character"),
        ({**OK, "valeu": 1}, "valeu", "not a known field"),
        ({**OK, "metadata": {"x": "y" * 20_000}}, "metadata", "keep it small"),
        ("thumbs up", None, "the body must be"),
        ({"feedback": []}, "feedback", "empty"),
        ({"feedback": {"a": 1}}, "feedback", "must be a list"),
        ({"feedback": [OK, {**OK, "value": [1]}]}, "feedback[1].value", "number"),
        ({"feedback": [OK, {"target": {"session_id": "s"}, "name": "n"}]}, "feedback[1].value", "give a value"),
        ([OK, 3], "feedback[1]", "feedback object"),
        ({"target": {"completion_id": "c"}, "name": "correction", "value": "ANSWER: 5"}, "value", "has no"),
        ({"target": {"completion_id": "c"}, "name": "correction", "comment": " "}, "value", "corrected answer"),
    ],
)
def test_refusals_name_the_field_and_the_fix(body: Any, param: str | None, words: str) -> None:
    with pytest.raises(FeedbackInputError) as err:
        parse_feedback(body)
    assert err.value.param == param
    assert words in str(err.value)


def test_the_api_spec_is_generated_from_the_validator_and_agrees_with_it() -> None:
    """What the spec allows is accepted, at its limits (it said 100 items and 4,000 characters)."""
    import jsonschema

    from storage.feedback_input import COMMENT_CHARS, MAX_BATCH, openapi_schema

    schema = openapi_schema()
    comment = "\U0001f600" * COMMENT_CHARS  # the spec's longest comment in 4-byte characters: the byte limit
    assert len(comment.encode()) == MAX_COMMENT_BYTES
    widest = {"target": {"session_id": "s" * 200}, "name": "n" * 200, "value": "v" * 1000, "comment": comment}
    batch = [widest] * MAX_BATCH
    jsonschema.validate(batch, schema)  # raises if the spec refuses it
    assert len(parse_feedback(batch)[0]) == MAX_BATCH
    for refused in ([widest] * (MAX_BATCH + 1), {**widest, "name": "a\x00b"}, {"target": {}, "name": "n", "value": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(refused, schema)
        with pytest.raises(FeedbackInputError):
            parse_feedback(refused)
