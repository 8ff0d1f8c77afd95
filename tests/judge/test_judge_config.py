"""The judge settings the admin API will take."""

from __future__ import annotations

import pytest

from storage.judge_config import JudgeSettingsError, parse_judge_settings


def test_defaults_and_fingerprint() -> None:
    cfg = parse_judge_settings({"rubric": "Correct and brief."})
    assert cfg is not None
    assert (cfg.mode, cfg.min_agreement, cfg.decision_threshold) == ("absolute", 0.6, 0.5)
    assert parse_judge_settings(None) is None
    same = parse_judge_settings({"rubric": "Correct and brief.", "min_agreement": 0.9})
    other = parse_judge_settings({"rubric": "Correct and brief.", "mode": "relative"})
    assert same is not None and other is not None
    assert cfg.fingerprint() == same.fingerprint()  # the gate is not part of what scores
    assert cfg.fingerprint() != other.fingerprint()
    assert cfg.fingerprint() == "46f771edb3b73698"  # text-readout fingerprints did not move when readout came
    read = parse_judge_settings({"rubric": "Correct and brief.", "readout": "probability"})
    shown = parse_judge_settings(
        {
            "rubric": "Correct and brief.",
            "readout": "probability",
            "examples": [{"text": "Answer: 4\nReview: Right.", "good": True}],
        }
    )
    assert read is not None and shown is not None
    assert len({cfg.fingerprint(), read.fingerprint(), shown.fingerprint()}) == 3  # examples change the score


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({}, "judge.rubric"),
        ({"rubric": "x", "mode": "pairwise"}, "judge.mode"),
        ({"rubric": "x", "scale": [1, 0]}, "judge"),
        ({"rubric": "x", "threshold": 5}, "judge"),
        ({"rubric": "x", "min_agreement": 2}, "judge.min_agreement"),
        ({"rubric": "x", "colour": "blue"}, "judge.colour"),
        ({"rubric": "x", "readout": "probability", "mode": "relative"}, "judge"),
        ({"rubric": "x", "readout": "logits"}, "judge.readout"),
        ({"rubric": "x", "labels": ["yes", "Yes"]}, "judge"),
        ({"rubric": "x", "examples": [{"text": "Answer: 4"}]}, "judge.examples.0.good"),
    ],
)
def test_refusals_name_the_field(raw: dict[str, object], param: str) -> None:
    with pytest.raises(JudgeSettingsError) as info:
        parse_judge_settings(raw)
    assert info.value.param == param
