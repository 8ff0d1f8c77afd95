"""``demo --jobs two``'s report: trained items by kind and family, curves per family, the gate's verdicts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from examples.jobs_report import classify, curves, family_of, lift, render, source_counts, verdicts, write_plot

START = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)


def test_each_trained_item_is_named_by_the_feedback_it_came_from() -> None:
    assert classify("reward", "fb1", "thumbs", None) == "numbers"
    assert classify("reward", "proxy:timeout", None, None) == "numbers"
    assert classify("correction", "fb2", "correction", "CALC: 3*4") == "corrections"
    assert classify("sdpo", "fb2", "correction", "CALC: 3*4") == "corrections"  # its self-distillation example
    assert classify("sdpo", "fb3", "review", "ANSWER: 12") == "comments"
    assert classify("sdpo", "implicit:c9", None, "ANSWER: Hi Sara, order 40213 is shipped") == "replies"
    # a RESULT: line after a LOOKUP: is a user message too; hindsight reads it as feedback on the lookup
    assert classify("sdpo", "implicit:c8", None, "LOOKUP: 40213") == "tool results"
    assert classify("sdpo", "implicit:c7", None, "The order is on its way") == "nudges"  # malformed: reminded
    assert (
        family_of("sp-0123") == "support" and family_of("ep-0123") == "arithmetic" and family_of(None) == "arithmetic"
    )


def test_sources_are_counted_per_version_and_family() -> None:
    rows: list[dict[str, Any]] = [
        {"version": 1, "objective": "reward", "feedback_id": "a", "session_id": "ep-1"},
        {"version": 1, "objective": "reward", "feedback_id": "b", "session_id": "ep-2"},
        {"version": 1, "objective": "sdpo", "feedback_id": "c", "feedback_name": "review", "session_id": "sp-1"},
        {"version": 10, "objective": "sdpo", "feedback_id": "implicit:x", "session_id": "sp-2", "reply": "ANSWER: hi"},
        {"version": None, "objective": "reward", "feedback_id": "d", "session_id": "ep-3"},  # published nothing
    ]
    assert source_counts(rows) == {
        "v1": {"arithmetic": {"numbers": 2}, "support": {"comments": 1}},
        "v10": {"support": {"replies": 1}},
    }


def family(name: str, held: bool, diff: float) -> dict[str, Any]:
    return {name: {"diff": diff, "stderr": 0.02, "gate": "held" if held else "promoted"}}


def events() -> list[dict[str, Any]]:
    return [
        {"version": 1, "decision": "candidate", "created_at": "2026-12-05T06:03:00+00:00"},
        {
            "version": 1,
            "serving_version": None,
            "decision": "promoted",
            "reason": "no family worse",
            "evidence": {"families": {**family("arithmetic", False, 0.05), **family("support", False, 0.01)}},
            "created_at": "2026-12-05T06:04:30+00:00",
        },
        {
            "version": 2,
            "serving_version": 1,
            "decision": "held",
            "reason": "worse on support (1 of 2 families)",
            "evidence": {"families": {**family("arithmetic", False, 0.08), **family("support", True, -0.2)}},
            "created_at": "2026-12-05T06:09:00+00:00",
        },
    ]


def test_the_verdicts_name_the_family_a_held_version_broke() -> None:
    decided = verdicts(events(), START)
    assert [(d["version"], d["decision"], d["held_families"]) for d in decided] == [
        (1, "promoted", []),
        (2, "held", ["support"]),
    ]
    assert decided[1]["minute"] == 9.0 and decided[1]["against"] == "v1"
    assert decided[1]["diffs"] == {"arithmetic": 0.08, "support": -0.2}


def evals() -> list[dict[str, Any]]:
    def row(i: int, version: int | None, name: str, at: str, scores: dict[str, float]) -> dict[str, Any]:
        mean = sum(scores.values()) / len(scores)
        return {"id": i, "version": version, "name": name, "n": len(scores), "mean": mean, "stderr": 0.1,
                "scores": scores, "created_at": f"2026-12-05T06:{at}+00:00"}  # fmt: skip

    return [
        row(1, None, "arithmetic", "01:00", {"a": 0.0, "b": 1.0, "c": 0.0}),
        row(2, None, "support", "01:30", {"x": 1.0, "y": 0.0}),
        row(3, 1, "arithmetic", "04:00", {"a": 1.0, "b": 1.0, "c": 0.0}),
        row(4, 1, "support", "04:20", {"x": 1.0, "y": 1.0}),
        row(5, 2, "arithmetic", "08:00", {"a": 1.0, "b": 1.0, "c": 1.0}),
        row(6, 2, "support", "08:40", {"x": 0.0, "y": 0.0}),
    ]


def test_curves_follow_each_family_over_time_with_the_gate_s_verdict() -> None:
    got = curves(evals(), verdicts(events(), START), START)
    assert list(got) == ["arithmetic", "support"]
    assert [(p["version"], p["minute"], p["decision"]) for p in got["support"]] == [
        (None, 1.5, "base"),
        (1, 4.3, "promoted"),
        (2, 8.7, "held"),
    ]
    assert got["arithmetic"][1]["mean"] == pytest.approx(2 / 3)


def test_lift_is_paired_over_the_items_both_versions_scored() -> None:
    assert lift(evals(), "arithmetic", 1) == {
        "diff": pytest.approx(1 / 3, abs=1e-4),
        "stderr": pytest.approx(1 / 3, abs=1e-4),
        "n": 3,
    }
    assert lift(evals(), "support", None) is None  # nothing serves but the base
    assert lift(evals(), "support", 7) is None


def test_the_report_prints_every_table_and_draws_the_plot(tmp_path: Path) -> None:
    decided = verdicts(events(), START)
    summary = {
        "curves": curves(evals(), decided, START),
        "final": {"arithmetic": lift(evals(), "arithmetic", 1), "support": lift(evals(), "support", 1)},
        "serving": "v1",
        "verdicts": decided,
        "sources": {"v1": {"arithmetic": {"numbers": 40, "corrections": 6}, "support": {"replies": 9}}},
    }
    text = render(summary)
    assert "| v2 | 8.7 | 2 | 0.0 ± 10.0 | held |" in text
    assert "| v1 | arithmetic | 40 | 0 | 6 | 0 | 0 |" in text
    assert "| v2 | 9.0 | v1 | held | support | arithmetic +8.0, support -20.0 |" in text
    assert "+33.3 ± 33.3 points" in text
    write_plot(summary, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
