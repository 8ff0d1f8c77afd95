"""Monitors: per alias and adapter version, windows over the proxy's own records, compared version to version.

Pure functions over plain values (the database side is ``storage.monitor_store``). Every monitor
is a ratio of sums over the sessions of a window, ``Σy / Σx`` (``x`` = 1 for a per-session mean),
with a cluster standard error (the session is the unit: calls of one session are not independent):

==========================  ===============================================  ====================
monitor                     y / x per session                                 default threshold
==========================  ===============================================  ====================
completion_tokens           completion tokens / calls (tokens per call)      ±25 % relative
answer_tokens               completion tokens of the session's last call     ±25 % relative
calls_per_session           calls / 1                                        ±50 % relative
tool_calls_per_session      tool calls (or results, if more) / 1             ±50 % relative
tool_error_rate             tool errors / tool results                       +0.05 absolute
timeout_rate                1 if timed out, aborted or disconnected / 1      +0.05 absolute
ungraded_share              1 if no harness or human grade / 1               +0.10 absolute
reward                      reward / 1 (graded sessions)                     −0.5 sd of baseline
judge_score                 the judge's grade / 1 (judged sessions)          −0.5 sd of baseline
kl_base                     Σ log μ − log π_base / sampled tokens            +0.05 nats/token
==========================  ===============================================  ====================

A breach needs both: the change is beyond the threshold (in its direction), and it is at least
``z`` (default 3) standard errors of the difference, with at least ``min_sessions`` (default 20)
sessions in each window. A version is compared with two baselines: its predecessor (the newest
earlier version with a full window: catches a jump) and the alias's reference (an admin-pinned
version, else the oldest version or the base model with a full window: catches a drift made of
steps each too small to see, "responses getting steadily shorter"). docs/monitors.md says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Kind = Literal["relative", "absolute", "sd"]
Direction = Literal["up", "down", "both"]


@dataclass(frozen=True)
class Threshold:
    """How far a window may move from a baseline's before it is an alert."""

    kind: Kind  # relative: fraction of the baseline; absolute: in the monitor's units; sd: baseline's spread
    size: float
    direction: Direction = "both"
    z: float = 3.0  # the change must also be this many standard errors of the difference


MONITORS: dict[str, Threshold] = {
    "completion_tokens": Threshold("relative", 0.25, "both"),
    "answer_tokens": Threshold("relative", 0.25, "both"),  # the last call: tool-calling turns do not dilute it
    "calls_per_session": Threshold("relative", 0.5, "both"),
    "tool_calls_per_session": Threshold("relative", 0.5, "both"),
    "tool_error_rate": Threshold("absolute", 0.05, "up"),
    "timeout_rate": Threshold("absolute", 0.05, "up"),
    "ungraded_share": Threshold("absolute", 0.10, "up"),
    "reward": Threshold("sd", 0.5, "down"),
    "judge_score": Threshold("sd", 0.5, "down"),
    "kl_base": Threshold("absolute", 0.05, "up"),
}
WINDOW_SESSIONS = 50  # the newest settled sessions of a version
MIN_SESSIONS = 20  # fewer than this in either window: no comparison
SETTLE_S = 60.0  # a session whose last call is younger may still get calls or its grade
# A tool result counts as an error when it matches one of these (a project replaces them).
TOOL_ERROR_PATTERNS = (r"(?i)^\s*(error|exception|traceback)\b", r'(?i)^\s*\{\s*"error"\s*:')


@dataclass(frozen=True)
class MonitorConfig:
    """An alias's monitor settings: the defaults above, overridden per alias through the admin API."""

    thresholds: Mapping[str, Threshold] = field(default_factory=lambda: dict(MONITORS))
    window_sessions: int = WINDOW_SESSIONS
    min_sessions: int = MIN_SESSIONS
    settle_s: float = SETTLE_S
    reference_version: int | Literal["base"] | None = None  # None: the oldest version with a full window
    tool_error_patterns: tuple[str, ...] = TOOL_ERROR_PATTERNS

    def to_dict(self) -> dict[str, Any]:
        return {
            "thresholds": {k: asdict(v) for k, v in self.thresholds.items()},
            "window_sessions": self.window_sessions,
            "min_sessions": self.min_sessions,
            "settle_s": self.settle_s,
            "reference_version": self.reference_version,
            "tool_error_patterns": list(self.tool_error_patterns),
        }


class MonitorConfigError(ValueError):
    """An override the monitors cannot use; the message names the field."""


def parse_config(alias_override: Mapping[str, Any] | None, patterns: Sequence[str] | None = None) -> MonitorConfig:
    """The defaults with an alias's overrides applied (``thresholds`` merge per monitor and per field)."""
    over = dict(alias_override or {})
    unknown = set(over) - {"thresholds", "window_sessions", "min_sessions", "settle_s", "reference_version"}
    if unknown:
        raise MonitorConfigError(f"monitors: unknown field {sorted(unknown)[0]!r}")
    thresholds = dict(MONITORS)
    for name, fields in (over.get("thresholds") or {}).items():
        if name not in MONITORS:
            raise MonitorConfigError(f"thresholds.{name}: no such monitor (one of {', '.join(MONITORS)})")
        if not isinstance(fields, Mapping) or set(fields) - {"kind", "size", "direction", "z"}:
            raise MonitorConfigError(f"thresholds.{name}: an object of kind, size, direction, z")
        t = replace(thresholds[name], **fields)
        if t.kind not in ("relative", "absolute", "sd") or t.direction not in ("up", "down", "both"):
            raise MonitorConfigError(f"thresholds.{name}: kind relative|absolute|sd, direction up|down|both")
        if not _number(t.size) or t.size < 0 or not _number(t.z) or t.z < 0:
            raise MonitorConfigError(f"thresholds.{name}: size and z are non-negative numbers")
        thresholds[name] = t
    ints = {k: over[k] for k in ("window_sessions", "min_sessions") if k in over}
    for key, value in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 2:
            raise MonitorConfigError(f"{key}: an integer of at least 2")
    settle = over.get("settle_s", SETTLE_S)
    if not _number(settle) or not 0 <= settle <= 30 * 86400:
        raise MonitorConfigError("settle_s: a number of seconds from 0 to 30 days")
    ref = over.get("reference_version")
    if ref is not None and ref != "base" and (not isinstance(ref, int) or isinstance(ref, bool) or ref < 1):
        raise MonitorConfigError("reference_version: a version number, 'base', or null (the oldest full window)")
    return MonitorConfig(
        thresholds=thresholds,
        window_sessions=ints.get("window_sessions", WINDOW_SESSIONS),
        min_sessions=ints.get("min_sessions", MIN_SESSIONS),
        settle_s=float(settle),
        reference_version=ref,
        tool_error_patterns=tuple(patterns) if patterns is not None else TOOL_ERROR_PATTERNS,
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SessionStats:
    """One settled session as the monitors see it (``storage.monitor_store.session_stats`` builds it)."""

    session_id: str
    version: int | None  # the adapter that served its last call; None: the base model
    ended_at: float  # unix seconds of its last call
    calls: int
    completion_tokens: int
    answer_tokens: int  # of the last call: the answer the user got, in an agent's session
    tool_calls: int
    tool_results: int
    tool_errors: int
    timed_out: bool
    graded: bool
    reward: float | None = None
    judge: float | None = None

    def samples(self) -> dict[str, tuple[float, float] | None]:
        """Per monitor, this session's (y, x); None where it has nothing to say (an ungraded reward)."""
        return {
            "completion_tokens": (self.completion_tokens, self.calls),
            "answer_tokens": (self.answer_tokens, 1.0),
            "calls_per_session": (self.calls, 1.0),
            "tool_calls_per_session": (self.tool_calls, 1.0),
            "tool_error_rate": (self.tool_errors, max(self.tool_results, self.tool_errors)),
            "timeout_rate": (float(self.timed_out), 1.0),
            "ungraded_share": (float(not self.graded), 1.0),
            "reward": (self.reward, 1.0) if self.reward is not None else None,
            "judge_score": (self.judge, 1.0) if self.judge is not None else None,
        }


@dataclass(frozen=True)
class Estimate:
    """A window's value of one monitor: Σy/Σx, its cluster standard error and spread, over n units."""

    value: float
    se: float
    sd: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "se": self.se, "sd": self.sd, "n": self.n}


def ratio_estimate(pairs: Iterable[tuple[float, float]]) -> Estimate | None:
    """Σy/Σx over units with a cluster (delta-method) standard error; None without any x."""
    units = list(pairs)
    n, sx = len(units), sum(x for _, x in units)
    if n == 0 or sx <= 0:
        return None
    r = sum(y for y, _ in units) / sx
    mean_x = sx / n
    resid = sum((y - r * x) ** 2 for y, x in units)
    se = math.sqrt(resid / (n * (n - 1))) / mean_x if n > 1 else math.inf
    sd = math.sqrt(resid / (n - 1)) / mean_x if n > 1 else 0.0
    return Estimate(r, se, sd, n)


def window(sessions: Sequence[SessionStats], extra: Mapping[str, Estimate] | None = None) -> dict[str, Estimate]:
    """Every monitor's estimate over these sessions (``extra``: measured elsewhere, e.g. ``kl_base``)."""
    by_monitor: dict[str, list[tuple[float, float]]] = {}
    for s in sessions:
        for name, pair in s.samples().items():
            if pair is not None:
                by_monitor.setdefault(name, []).append(pair)
    out = {name: est for name, pairs in by_monitor.items() if (est := ratio_estimate(pairs)) is not None}
    return {**out, **(extra or {})}


@dataclass(frozen=True)
class Breach:
    monitor: str
    value: float
    baseline: float
    change: float  # value - baseline
    z: float  # change in standard errors of the difference
    limit: float  # the change the threshold allowed, in the monitor's units (signed by direction)
    baseline_version: int | None
    against: str  # "predecessor" | "reference"

    def message(self, version: int | None) -> str:
        where = f"v{version}" if version is not None else "base"
        base = f"v{self.baseline_version}" if self.baseline_version is not None else "base"
        return (
            f"{self.monitor} {self.value:.4g} on {where} vs {self.baseline:.4g} on {base} ({self.against}): "
            f"change {self.change:+.4g} beyond {self.limit:+.4g}, {self.z:.1f} standard errors"
        )


def compare(
    current: Mapping[str, Estimate],
    baseline: Mapping[str, Estimate],
    config: MonitorConfig,
    baseline_version: int | None,
    against: str,
) -> list[Breach]:
    """The monitors whose window moved beyond its threshold from the baseline's window."""
    out = []
    for name, t in config.thresholds.items():
        cur, base = current.get(name), baseline.get(name)
        if cur is None or base is None or min(cur.n, base.n) < config.min_sessions:
            continue
        change = cur.value - base.value
        allowed = {"relative": t.size * abs(base.value), "absolute": t.size, "sd": t.size * base.sd}[t.kind]
        se = math.hypot(cur.se, base.se)
        z = abs(change) / se if se > 0 else (math.inf if change else 0.0)
        up, down = change > 0 and change >= allowed, change < 0 and -change >= allowed
        moved = (up and t.direction != "down") or (down and t.direction != "up")
        if moved and change != 0 and z >= t.z:
            limit = allowed if change > 0 else -allowed
            out.append(Breach(name, cur.value, base.value, change, z, limit, baseline_version, against))
    return out


def baselines(
    versions: Sequence[int | None], full: Mapping[int | None, bool], config: MonitorConfig
) -> dict[int | None, list[tuple[int | None, str]]]:
    """For each version with a full window: the (version, "predecessor"|"reference") windows to compare with.

    ``versions`` in serving order (the base model, None, first). The predecessor is the newest
    earlier version with a full window; the reference an admin's pin, else the oldest full one.
    """
    with_full = sorted((v for v in versions if full.get(v)), key=_order)
    pin = config.reference_version
    reference = (None if pin == "base" else pin) if pin is not None else (with_full[0] if with_full else None)
    out: dict[int | None, list[tuple[int | None, str]]] = {}
    for i, v in enumerate(with_full):
        pairs: list[tuple[int | None, str]] = []
        predecessor = with_full[i - 1] if i > 0 else None
        if i > 0:
            pairs.append((predecessor, "predecessor"))
        if reference in with_full and _order(reference) < _order(v) and (i == 0 or reference != predecessor):
            pairs.append((reference, "reference"))
        out[v] = pairs
    return out


def _order(version: int | None) -> int:
    return -1 if version is None else version
