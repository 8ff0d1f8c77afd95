"""The arms table: lift, its standard error, and a verdict only beyond one standard error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from examples.arms import arm_lift, load, main, verdict


def summary(tmp_path: Path, arm: str, seed: int, rewards: list[float], se: float = 0.05) -> Path:
    rows = [{"round": i + 1, "heldout_mean_reward": r, "heldout_stderr": se} for i, r in enumerate(rewards)]
    path = tmp_path / f"{arm}-s{seed}.json"
    path.write_text(json.dumps({"feedback": arm, "config": {"seed": seed, "judge": True}, "rounds": rows}))
    return path


def test_lift_is_the_last_two_rows_minus_round_one(tmp_path: Path) -> None:
    run = load(summary(tmp_path, "numeric", 0, [0.40, 0.50, 0.60, 0.70, 0.80, 0.95, 0.99]))
    lift, se = run.lift  # a 6-round run contributes its first five rows
    assert lift == pytest.approx(0.75 - 0.40)
    assert se == pytest.approx(math.sqrt(0.05**2 + 2 * 0.05**2 / 4))


def test_a_short_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="3 held-out rows, 5 needed"):
        load(summary(tmp_path, "numeric", 0, [0.4, 0.5, 0.6]))


def test_seeds_average_and_their_error_shrinks(tmp_path: Path) -> None:
    runs = [load(summary(tmp_path, "comments", s, [0.4, 0.4, 0.4, base, base])) for s, base in ((0, 0.5), (1, 0.7))]
    lift, se, spread = arm_lift(runs)
    assert lift == pytest.approx(0.2) and spread == pytest.approx(0.2)
    assert se == pytest.approx(runs[0].lift[1] / math.sqrt(2))


def test_the_verdict_needs_one_standard_error() -> None:
    assert verdict((0.20, 0.02), (0.30, 0.02)).startswith("comments reach half")
    assert verdict((0.02, 0.02), (0.30, 0.02)).startswith("comments fall short")
    assert verdict((0.14, 0.05), (0.30, 0.05)).startswith("inconclusive")


def test_the_command_prints_a_table_and_draws_the_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [
        summary(tmp_path, "numeric", 0, [0.4, 0.5, 0.6, 0.7, 0.7]),
        summary(tmp_path, "comments", 0, [0.4, 0.4, 0.5, 0.5, 0.6]),
    ]
    assert main([*map(str, files), "--plot", str(tmp_path / "arms.png")]) == 0
    out = capsys.readouterr().out
    assert "numeric" in out and "+30.0" in out and "comments" in out and "+15.0" in out
    assert (tmp_path / "arms.png").read_bytes()[:4] == b"\x89PNG"


def test_comments_taught_with_the_topk_form_are_an_arm_of_their_own(tmp_path: Path) -> None:
    path = summary(tmp_path, "comments", 0, [0.4, 0.5, 0.6, 0.7, 0.8])
    data = json.loads(path.read_text())
    data["config"]["sdpo_form"] = "topk"
    path.write_text(json.dumps(data))
    assert load(path).arm == "comments/topk"
    data["config"].pop("judge")  # the runs from before the judge read comments: self-distillation alone
    path.write_text(json.dumps(data))
    assert load(path).arm == "comments/topk/no-judge"
    data["config"] |= {"sdpo_form": "token", "judge": True, "sdpo_weight": 0.0}
    path.write_text(json.dumps(data))
    assert load(path).arm == "comments/sdpo-weight-0"
    assert load(summary(tmp_path, "numeric", 1, [0.4, 0.5, 0.6, 0.7, 0.8])).arm == "numeric"


def test_corrections_of_the_first_call_are_an_arm_of_their_own(tmp_path: Path) -> None:
    path = summary(tmp_path, "corrections", 0, [0.4, 0.5, 0.6, 0.7, 0.8])
    data = json.loads(path.read_text())
    data["config"] |= {"sdpo_weight": 0.0, "correct": "first"}
    path.write_text(json.dumps(data))
    assert load(path).arm == "corrections/first/sdpo-weight-0"
    data["config"]["correct"] = "last"
    path.write_text(json.dumps(data))
    assert load(path).arm == "corrections/sdpo-weight-0"
