"""The talk's scenarios as data: the phases each one serves, what the monitors should flag, and what a run saw.

:mod:`bench.talk_cases` drives them through the proxy (its docstring tells the two cases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALIAS = "agent"
THOUGHT = 8  # tokens of each tool-calling turn
ANSWER = 40  # mean tokens of the final answer
DEADLINE = 8  # tool calls the harness's episode budget allows
FLOOD = 12  # tool calls of a flooding session
CUT_TOKENS = 256  # the call the deadline cuts asks for a long turn: the hang-up lands while it streams
BATCH = 5  # sessions run at once; the monitors run after each batch
CLEAN_SEEDS = 100  # clean runs use seeds 100, 101, ...: other seeds than the faulty runs
# The policies the runs use (PUT /v1/admin/aliases/{alias}/policy), defaults except the canary's: half the
# sessions (at the default 0.1 a candidate needs ~200 sessions before the monitors can compare its 20), and a
# margin of 0.25 reward (at the default 0.05, two versions whose reward is equal, as every version's is here by
# construction, need ~700 graded sessions per arm before the canary can promote either).
POLICIES: dict[str, dict[str, Any]] = {
    "auto": {"mode": "auto"},
    "gate": {"mode": "gate"},
    "canary": {"mode": "canary", "share": 0.5, "margin": 0.25},
}
# The harness's eval of every version: the same score on the same items (paired), so the gate promotes and the
# canary's eval rule never rolls back; only the monitors can tell the versions apart.
EVAL = {"name": "heldout", "n": 20, "mean": 0.5, "stderr": 0.11, "scores": {f"q{i}": float(i % 2) for i in range(20)}}
MAX_SESSIONS = 300  # a phase whose candidate is still undecided after this many sessions ends (undecided)
DECIDED = ("promoted", "held", "rolled_back")
EXPECTED = {
    "short": {"tool_error_rate": 1, "answer_tokens": 2, "completion_tokens": 2},  # monitor: the phase its cause starts
    "flood": {"timeout_rate": 1},
}


@dataclass(frozen=True)
class Phase:
    version: int | None
    answer: float = 1.0  # final-answer length factor
    tool_fail: float = 0.0
    flood: float = 0.0


def scenario(name: str) -> list[Phase]:
    if name == "short":
        return [Phase(None), Phase(1, tool_fail=0.1), *(Phase(v, 0.85 ** (v - 1), 0.1) for v in range(2, 7))]
    if name == "flood":
        return [Phase(None), *(Phase(v, flood=0.1 * v) for v in range(1, 7))]
    if name == "clean":
        return [Phase(None), *(Phase(v) for v in range(1, 7))]
    raise ValueError(f"no scenario {name!r}: short | flood | clean")


@dataclass
class Decision:
    """What the policy did with one published version."""

    version: int
    level: int  # steps of drift: one beyond the version serving when it was published
    decision: str | None = None  # promoted | held | rolled_back; None: undecided when its phase ended
    after: int = 0  # sessions run since it was published, at the decision
    served: int = 0  # of those, sessions the candidate itself served (canary's share)
    alerts: list[str] = field(default_factory=list)  # the decision's evidence: open alerts, monitor@vN

    def __str__(self) -> str:
        why = f" [{', '.join(self.alerts)}]" if self.alerts else ""
        return f"v{self.version} L{self.level} {self.decision or 'undecided'} {self.after}/{self.served}{why}"


@dataclass
class Run:
    """What one scenario run saw: when each alert opened, counted in sessions, and each promotion decision."""

    name: str
    seed: int
    sessions_per_phase: int
    policy: str = "auto"
    opened: list[dict[str, Any]] = field(default_factory=list)  # {monitor, version, session, against}
    decisions: list[Decision] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # sessions run before each phase began
    sessions_run: int = 0
    calls: int = 0
    seconds: float = 0.0

    def delay(self, monitor: str, phase: int) -> int | None:
        """Sessions from the first session of ``phase`` until ``monitor``'s first alert (None: never)."""
        if phase >= len(self.starts):
            return None
        start = self.starts[phase]
        hits = [a["session"] - start for a in self.opened if a["monitor"] == monitor and a["session"] > start]
        return min(hits) if hits else None
