"""The monitors' arithmetic on hand-made windows: estimates, thresholds with standard errors, baselines, overrides."""

from __future__ import annotations

import math

import pytest

from storage.monitors import (
    MonitorConfig,
    MonitorConfigError,
    SessionStats,
    baselines,
    compare,
    parse_config,
    ratio_estimate,
    window,
)


def session(
    i: int,
    *,
    tokens: int = 40,
    calls: int = 4,
    tools: int = 3,
    errors: int = 0,
    cut: bool = False,
    version: int | None = 1,
) -> SessionStats:
    reward = 0.0 if cut else 1.0
    return SessionStats(
        f"s{i}", version, float(i), calls, tokens * calls, tokens, tools, tools, errors, cut, not cut, reward
    )


def test_ratio_estimate_is_sum_over_sum_with_a_cluster_standard_error() -> None:
    est = ratio_estimate([(2.0, 1.0), (4.0, 1.0)])
    assert est is not None and est.value == 3.0 and est.n == 2
    assert est.se == pytest.approx(1.0)  # sd sqrt(2) over sqrt(2) sessions
    est = ratio_estimate([(10.0, 2.0), (30.0, 2.0)])  # tokens per call: 40 / 4
    assert est is not None and est.value == 10.0
    assert ratio_estimate([(1.0, 0.0)]) is None


def test_a_shorter_window_breaches_only_beyond_the_threshold_and_the_noise() -> None:
    config = MonitorConfig()
    base = window([session(i, tokens=40 + (i % 5)) for i in range(30)])
    shorter = window([session(i, tokens=28 + (i % 5)) for i in range(30)])  # -28 %
    slightly = window([session(i, tokens=36 + (i % 5)) for i in range(30)])  # -10 %: inside the threshold
    found = compare(shorter, base, config, None, "reference")
    assert [b.monitor for b in found] == ["completion_tokens", "answer_tokens"]
    assert found[0].change == pytest.approx(-12.0) and found[0].z > 3
    assert compare(slightly, base, config, None, "predecessor") == []
    # Too few sessions in a window: nothing is compared.
    assert compare(window([session(i, tokens=10) for i in range(5)]), base, config, None, "predecessor") == []


def test_noisy_windows_need_the_standard_errors_too() -> None:
    # Tool error rate +10 points, but over sessions so varied that it is under 3 standard errors.
    noisy = window([session(i, tools=1 if i % 2 else 9, errors=(i % 3 == 0) * 3) for i in range(20)])
    calm = window([session(i, tools=1 if i % 2 else 9, errors=(i % 7 == 0)) for i in range(20)])
    change = noisy["tool_error_rate"].value - calm["tool_error_rate"].value
    assert change > MonitorConfig().thresholds["tool_error_rate"].size
    z = change / math.hypot(noisy["tool_error_rate"].se, calm["tool_error_rate"].se)
    assert (z >= 3) == any(b.monitor == "tool_error_rate" for b in compare(noisy, calm, MonitorConfig(), 1, "x"))


def test_directions_timeouts_up_alert_down_do_not() -> None:
    config = MonitorConfig()
    clean = window([session(i) for i in range(40)])
    cut = window([session(i, cut=i % 3 == 0) for i in range(40)])
    assert {b.monitor for b in compare(cut, clean, config, 1, "p")} == {"timeout_rate", "ungraded_share", "reward"}
    assert compare(clean, cut, config, 1, "p") == []  # fewer timeouts, more grades, more reward: not an alert


def test_baselines_are_the_predecessor_and_the_oldest_full_window() -> None:
    full = {None: True, 1: True, 2: False, 3: True, 4: True}
    got = baselines([None, 1, 2, 3, 4], full, MonitorConfig())
    assert got == {
        None: [],
        1: [(None, "predecessor")],
        3: [(1, "predecessor"), (None, "reference")],
        4: [(3, "predecessor"), (None, "reference")],
    }
    pinned = baselines([None, 1, 3, 4], full, parse_config({"reference_version": 3}))
    assert pinned[4] == [(3, "predecessor")] and pinned[1] == [(None, "predecessor")]


def test_alias_overrides_merge_per_field_and_bad_ones_name_the_field() -> None:
    config = parse_config({"thresholds": {"completion_tokens": {"size": 0.1}}, "window_sessions": 30}, ["FAIL"])
    assert config.thresholds["completion_tokens"].size == 0.1
    assert config.thresholds["completion_tokens"].direction == "both"
    assert config.window_sessions == 30 and config.tool_error_patterns == ("FAIL",)
    bad_ones = [
        ({"thresholds": {"nope": {}}}, "thresholds.nope"),
        ({"window_sessions": 1}, "window_sessions"),
        ({"thresholds": {"reward": {"kind": "odd"}}}, "thresholds.reward"),
        ({"x": 1}, "'x'"),
    ]
    for bad, field in bad_ones:
        with pytest.raises(MonitorConfigError, match=field):
            parse_config(bad)
