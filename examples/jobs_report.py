"""What ``onthejob demo --jobs two`` reports, from what the deployment stored: pure functions over rows.

Three readings, each from the deployment's own records (never from the demo's memory of what it did):

* **held-out over time**: every eval row of the alias, one task family per eval name; the minute is
  when the row was posted, counted from the run's start;
* **what each version learned from**: every ``used_feedback`` row of a step that published the
  version, classified by the feedback item it used (:func:`classify`) and by task family (the
  session the trained call belongs to);
* **the gate's verdicts**: the ``promotion_events`` rows, and for a held version the families its
  evidence names as worse.

:func:`render` prints them, :func:`write_plot` draws the per-family curves.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

FAMILIES = ("arithmetic", "support")
SOURCES = ("numbers", "comments", "corrections", "replies", "nudges", "tool results")
TOOLS = ("CALC", "LOOKUP")  # the two families' tool calls in their text protocols
FINAL = ("promoted", "held", "rolled_back", "superseded", "manual")


def family_of(session_id: str | None) -> str:
    """The task family a session belongs to: the support harness names its sessions ``sp-…``."""
    return "support" if (session_id or "").startswith("sp-") else "arithmetic"


def classify(objective: str, feedback_id: str, feedback_name: str | None, reply: str | None) -> str:
    """Which kind of feedback one trained item came from.

    ``reward`` (a scalar: a grade, thumbs, an outcome, or the proxy's own view of a failure) is a number;
    ``correction`` (filtered SFT) and an SDPO example of a correction are corrections; an SDPO example of
    next-turn text (``implicit:…``) is a reply when the call it teaches answered (``ANSWER:``), a tool
    result when it called the tool (``CALC:``/``LOOKUP:``: in the demo's text protocol the ``RESULT:`` line is
    a user message, read as feedback unless the project's ``implicit_feedback_skip`` names it), and a nudge
    otherwise (a malformed line, followed by the harness's "Reply with ..." reminder); any other SDPO
    example is a comment.
    """
    if objective == "reward":
        return "numbers"
    if objective == "correction" or feedback_name == "correction":
        return "corrections"
    if feedback_id.startswith("implicit:"):
        line = (reply or "").lstrip()
        return "replies" if line.startswith("ANSWER") else "tool results" if line.startswith(TOOLS) else "nudges"
    return "comments"


def source_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """Per version label (``v3``), per family, per source: how many items its step trained on.

    Each row: ``version`` (the step's published version; None: a step that published nothing, left out),
    ``objective``, ``feedback_id``, ``feedback_name``, ``session_id`` and ``reply`` (the trained call's text).
    """
    out: dict[str, dict[str, Counter[str]]] = {}
    for row in rows:
        if row.get("version") is None:
            continue
        family = family_of(row.get("session_id"))
        source = classify(str(row["objective"]), str(row["feedback_id"]), row.get("feedback_name"), row.get("reply"))
        out.setdefault(f"v{row['version']}", {}).setdefault(family, Counter())[source] += 1
    return {
        v: {f: dict(c) for f, c in sorted(fams.items())}
        for v, fams in sorted(out.items(), key=lambda kv: int(kv[0][1:]))
    }


def minute(at: str | None, start: datetime) -> float | None:
    """Minutes from ``start`` to an ISO time (a naive time is taken as the same zone as ``start``)."""
    if not at:
        return None
    when = datetime.fromisoformat(at)
    if when.tzinfo is None and start.tzinfo is not None:
        when = when.replace(tzinfo=start.tzinfo)
    return round((when - start).total_seconds() / 60, 1)


def label(version: int | None) -> str:
    return "base" if version is None else f"v{version}"


def verdicts(events: Sequence[Mapping[str, Any]], start: datetime) -> list[dict[str, Any]]:
    """Each version's final decision (promoted, held, superseded …), oldest first; a held version's
    ``families`` are those its evidence names as worse (the gate's per-family verdicts)."""
    out: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("decision") not in FINAL or event.get("version") is None:
            continue
        families = ((event.get("evidence") or {}).get("families")) or {}
        worse = sorted(name for name, cmp in families.items() if (cmp or {}).get("gate") == "held")
        diffs = {name: (cmp or {}).get("diff") for name, cmp in sorted(families.items())}
        out[int(event["version"])] = {
            "version": int(event["version"]),
            "decision": event["decision"],
            "minute": minute(event.get("created_at"), start),
            "against": label(event.get("serving_version")),
            "held_families": worse,
            "diffs": diffs,
            "reason": event.get("reason") or "",
        }
    return [out[v] for v in sorted(out)]


def curves(
    evals: Sequence[Mapping[str, Any]], decided: Sequence[Mapping[str, Any]], start: datetime
) -> dict[str, list[dict[str, Any]]]:
    """Per family (eval name): every eval row of it in the order posted, as ``version``, ``minute``, ``n``,
    ``mean``, ``stderr`` and ``decision`` ("base", or the gate's verdict on the version; "pending": none)."""
    decision = {d["version"]: d["decision"] for d in decided}
    out: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(evals, key=lambda r: (r.get("created_at") or "", r.get("id") or 0)):
        version = row.get("version")
        out.setdefault(str(row["name"]), []).append(
            {
                "version": version,
                "minute": minute(row.get("created_at"), start),
                "n": int(row["n"]),
                "mean": float(row["mean"]),
                "stderr": float(row["stderr"]),
                "decision": "base" if version is None else str(decision.get(version, "pending")),
            }
        )
    return out


def lift(evals: Sequence[Mapping[str, Any]], family: str, version: int | None) -> dict[str, float] | None:
    """``version`` against the base on ``family``: the mean difference over the items both scored, with its
    standard error (paired); None when either has no eval of it with scores."""
    newest: dict[Any, Mapping[str, Any]] = {}
    for row in sorted(evals, key=lambda r: r.get("id") or 0):
        if row["name"] == family:
            newest[row.get("version")] = row
    if version is None or version not in newest or None not in newest:
        return None
    a, b = newest[version].get("scores") or {}, newest[None].get("scores") or {}
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return None
    d = [float(a[k]) - float(b[k]) for k in common]
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    return {"diff": round(mean, 4), "stderr": round(se, 4), "n": len(d)}


def render(summary: Mapping[str, Any]) -> str:
    """The tables the demo prints at the end (and ``docs/learning.md`` copies)."""
    lines: list[str] = []
    for family, points in summary["curves"].items():
        lines += [
            f"\n{family}: held-out reward over time",
            "| version | minute | n | mean ± s.e. | gate |",
            "|---|---|---|---|---|",
        ]
        for p in points:
            at = "-" if p["minute"] is None else f"{p['minute']:.1f}"
            lines.append(
                f"| {label(p['version'])} | {at} | {p['n']} | {100 * p['mean']:.1f} ± {100 * p['stderr']:.1f} "
                f"| {p['decision']} |"
            )
        final = summary["final"].get(family)
        if final is not None:
            lines.append(
                f"serving at the end ({summary['serving']}) against base, paired over {final['n']} items: "
                f"{100 * final['diff']:+.1f} ± {100 * final['stderr']:.1f} points"
            )
    lines += ["\nwhat each version learned from (trained items per family and kind)"]
    lines += ["| version | family | " + " | ".join(SOURCES) + " |", "|---|---|" + "---|" * len(SOURCES)]
    for version, families in summary["sources"].items():
        for family, counts in families.items():
            cells = " | ".join(str(counts.get(s, 0)) for s in SOURCES)
            lines.append(f"| {version} | {family} | {cells} |")
    lines += ["\nthe gate's verdicts", "| version | minute | against | verdict | worse on | diff per family |"]
    lines += ["|---|---|---|---|---|---|"]
    for d in summary["verdicts"]:
        diffs = ", ".join(f"{k} {100 * v:+.1f}" for k, v in d["diffs"].items() if v is not None) or "-"
        worse = ", ".join(d["held_families"]) or "-"
        at = "-" if d["minute"] is None else f"{d['minute']:.1f}"
        lines.append(f"| v{d['version']} | {at} | {d['against']} | {d['decision']} | {worse} | {diffs} |")
    return "\n".join(lines)


def write_plot(summary: Mapping[str, Any], path: Path) -> None:
    """Per family, held-out reward (± s.e.) against minutes; promoted versions filled, held ones crossed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.2), dpi=120)
    marks = {"base": "s", "promoted": "o", "held": "x", "superseded": "v", "pending": "."}
    for i, (family, points) in enumerate(summary["curves"].items()):
        color = f"C{i}"
        shown = [p for p in points if p["minute"] is not None]
        ax.plot([p["minute"] for p in shown], [100 * p["mean"] for p in shown], color=color, alpha=0.4, label=family)
        for p in shown:
            ax.errorbar(
                p["minute"],
                100 * p["mean"],
                yerr=100 * p["stderr"],
                color=color,
                marker=marks.get(p["decision"], "."),
                markersize=8 if p["decision"] == "held" else 6,
                capsize=3,
            )
            ax.annotate(
                label(p["version"]),
                (p["minute"], 100 * p["mean"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.plot([], [], "ko", label="promoted")
    ax.plot([], [], "kx", label="held by the gate")
    ax.set_xlabel("minutes since the run started")
    ax.set_ylabel("held-out reward (0–100)")
    ax.set_ylim(0, 100)
    ax.set_title("One alias, two jobs: held-out reward per task family")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
