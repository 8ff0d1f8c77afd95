"""The demo's orchestration: config from the CLI, the table, the plot, the summary; and the whole
loop (`onthejob demo --rounds 2`) with the tiny model against a real engine, proxy and trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examples.demo import evaluated, run_demo
from examples.demo_report import HEADER, RoundResult, table_row, trivial_baseline, write_plot, write_summary
from examples.demo_stack import DemoConfig, Stack
from examples.episodes import Summary
from examples.failures import compare_run
from onthejob.cli import build_parser


def summary(mean: float, n: int = 48) -> Summary:
    return Summary(
        n=n, mean_reward=mean, stderr=0.05, accuracy=mean + 0.1, mean_completion_tokens=30.0, timeouts=1, errors=0
    )


def rounds() -> list[RoundResult]:
    return [
        RoundResult(
            1,
            None,
            summary(0.36),
            summary(0.15),
            traffic_tokens=9000,
            trained_version=1,
            excluded={"ungraded": 7, "eval": 48},
        ),
        RoundResult(
            2,
            1,
            summary(0.45),
            summary(0.25),
            traffic_tokens=8000,
            trained_version=2,
            verdict="held",
            traffic_version=None,
            flipped=True,
        ),
        RoundResult(3, 2, summary(0.58), None),
    ]


def test_config_comes_from_the_cli_flags() -> None:
    args = build_parser().parse_args(["demo", "--rounds", "2", "--out", "x", "--model", "tiny"])
    cfg = DemoConfig.from_args(args)
    assert (cfg.rounds, cfg.out, cfg.model) == (2, Path("x"), "tiny")
    assert cfg.heldout == DemoConfig().heldout
    default = DemoConfig.from_args(build_parser().parse_args(["demo"]))
    assert default.model == "default" and default.rounds == args_default("rounds")
    assert default.feedback == "numeric"
    arm = DemoConfig.from_args(build_parser().parse_args(["demo", "--feedback", "comments"]))
    assert arm.feedback == "comments"
    assert (default.promotion, default.flip_reward) == ("auto", ())
    gated = DemoConfig.from_args(build_parser().parse_args(["demo", "--promotion", "gate", "--flip-reward", "2,4"]))
    assert (gated.promotion, gated.flip_reward) == ("gate", (2, 4))
    seeded = DemoConfig.from_args(build_parser().parse_args(["demo", "--seed", "3"]))
    assert (seeded.seed, default.seed) == (3, 0)


def args_default(name: str) -> Any:
    return getattr(build_parser().parse_args(["demo"]), name)


def test_table_rows_line_up_with_the_header() -> None:
    lines = [table_row(r) for r in rounds()]
    assert "base" in lines[0] and "v1" in lines[0] and "eval=48, ungraded=7" in lines[0]
    assert lines[0].split()[2] == "36.0"
    assert "v2" in lines[2] and lines[2].split()[-2] == "-"  # the final round deploys nothing
    assert lines[1].split()[6:10] == ["30.0", "held", "base", "25.0*"]  # gate's verdict; traffic stayed on base
    width = HEADER.index("excluded")
    assert all(len(line) >= width for line in lines)


def test_held_out_runs_on_the_first_every_other_and_last_round() -> None:
    assert [r for r in range(1, 8) if evaluated(r, rounds=6, every=2)] == [1, 3, 5, 7]
    assert [r for r in range(1, 7) if evaluated(r, rounds=5, every=2)] == [1, 3, 5, 6]
    assert [r for r in range(1, 8) if evaluated(r, rounds=6, every=1)] == list(range(1, 8))
    assert [r for r in range(1, 4) if evaluated(r, rounds=2, every=3)] == [1, 3]
    assert DemoConfig.from_args(build_parser().parse_args(["demo", "--eval-every", "2"])).eval_every == 2
    assert DemoConfig.from_args(build_parser().parse_args(["demo"])).eval_every == 1


def test_a_round_without_held_out_says_so(tmp_path: Path) -> None:
    rs = rounds()
    rs.insert(2, RoundResult(3, 2, None, summary(0.3), traffic_tokens=7000, trained_version=3))
    rs[-1].round, rs[-1].adapter_version = 4, 3
    line = table_row(rs[2])
    assert "not evaluated" in line and len(line) == len(table_row(rs[1]))
    write_plot(rs, 0.01, tmp_path / "p.png")
    stack = Stack(DemoConfig(out=tmp_path, database_url="sqlite:///x.db"))
    s = write_summary(
        DemoConfig(out=tmp_path), stack, rs, {"answer": "0", "mean_reward": 0.0}, tmp_path / "summary.json", 12.0
    )
    assert [r["evaluated"] for r in s["rounds"]] == [True, True, False, True]
    assert s["rounds"][2]["heldout_mean_reward"] is None and s["rounds"][2]["heldout_n"] == 0
    assert s["final_heldout_mean_reward"] == 0.58


def test_trivial_baseline_is_near_zero() -> None:
    b = trivial_baseline(48)
    assert b["mean_reward"] < 0.05 and b["answer"]


def test_plot_and_summary(tmp_path: Path) -> None:
    rs = rounds()
    write_plot(rs, 0.01, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stack = Stack(DemoConfig(out=tmp_path, database_url="sqlite:///x.db"))
    stack.model_name = "m"
    alert = {"kind": "attestation", "name": "fingerprint", "version": 2, "status": "open", "message": "m"}
    s = write_summary(
        DemoConfig(out=tmp_path),
        stack,
        rs,
        {"answer": "0", "mean_reward": 0.0},
        tmp_path / "summary.json",
        12.0,
        [alert],
    )
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))
    assert [r["adapter_version"] for r in on_disk["rounds"]] == [None, 1, 2]
    first = on_disk["rounds"][0]
    assert (first["heldout_mean_reward"], first["heldout_stderr"], first["heldout_n"]) == (0.36, 0.05, 48)
    assert on_disk["improvement_points"] == pytest.approx(22.0)
    assert on_disk["alerts"] == [alert]


def used_sessions(db_url: str, project: str) -> set[str]:
    """Sessions whose trajectories a training step consumed."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.models import Completion, UsedFeedback

    engine = sync_engine(db_url)
    try:
        with Session(engine) as db:
            ids = db.scalars(select(UsedFeedback.trajectory_id).where(UsedFeedback.project_id == project)).all()
            leaves = [i.rsplit(":", 1)[0] for i in ids]
            return set(db.scalars(select(Completion.session_id).where(Completion.id.in_(leaves))).all())
    finally:
        engine.dispose()


@pytest.mark.engine
@pytest.mark.slow
def test_demo_two_rounds_with_the_tiny_model(
    tiny_engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same code path as `onthejob demo --rounds 2`, sized down, on an engine the suite started."""
    cfg = DemoConfig(
        rounds=2,
        out=tmp_path / "out",
        model="tiny",
        upstream=tiny_engine.url,
        heldout=4,
        problems=2,
        attempts=2,
        workers=4,
        progress=False,
        promotion="gate",
    )
    result = run_demo(cfg)
    out = cfg.out
    printed = capsys.readouterr().out
    assert HEADER in printed
    assert (out / "heldout_reward.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result))
    assert [r["round"] for r in summary["rounds"]] == [1, 2, 3]
    assert [r["heldout_n"] for r in summary["rounds"]] == [4, 4, 4]  # under gate every round is evaluated
    assert summary["rounds"][0]["adapter_version"] is None
    # Every episode times out (reward 0): each task's attempts tie, no trajectory has an advantage, so
    # nothing is published, no candidate reaches the gate and the base model serves every round.
    assert [(r["verdict"], r["adapter_version"], r["trained_version"]) for r in summary["rounds"]] == [
        (None, None, None)
    ] * 3
    assert "nothing to learn" in (out / "train-round1.log").read_text()
    # the tiny model's text is noise: every episode times out, and the harness says so
    assert all(r["feedback"] == {"outcome": 4} for r in summary["rounds"][:2])
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3 * 4 + 2 * 4  # three held-out passes (gate), two rounds of traffic
    assert {e["outcome"] for e in episodes} == {"timeout"}
    assert all(e["completion_ids"] for e in episodes)  # the proxy named every call
    assert summary["rounds"][0]["excluded"].get("eval", 0) >= 4  # held-out sessions are graded, never trained on
    assert summary["alerts"] == []  # the tiny model in float32 probes alike under load: no attestation alert
    used = used_sessions(f"sqlite:///{out / 'onthejob.db'}", summary["project"])
    heldout = {e["session_id"] for e in episodes if e["eval"]}
    assert used and not used & heldout
    assert (out / "train-round1.log").is_file() and (out / "proxy.log").is_file()
    # `onthejob mine` over the run's own recorded calls finds what the episodes file counts.
    counted = {mode: (direct, found) for mode, direct, found in compare_run(out) if direct is not None}
    assert counted["timeout"] == (20, 20) and all(d == f for d, f in counted.values()), counted
