"""``onthejob mine``'s report files: JSON (the data), Markdown (for people), a plot of mode shares per version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _version(v: Any) -> str:
    return "base" if v is None else f"v{v}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def markdown(report: dict[str, Any]) -> str:
    """Counts and shares per mode, the trend per adapter version, and a few example sessions."""
    scope = f"alias {report['alias']}" if report["alias"] else "all aliases"
    since = f" since {report['since']}" if report["since"] else ""
    lines = [f"# Failure modes: project {report['project']}, {scope}{since}", "", f"{report['calls']} calls.", ""]
    if not report["modes"]:
        return "\n".join([*lines, "No failure mode found.", ""])
    versions = report["versions"]
    head = "| mode | count | share | " + " | ".join(_version(v["version"]) for v in versions) + " |"
    lines += [head, "|" + "---|" * (3 + len(versions))]
    for mode, m in report["modes"].items():
        per = [_pct(v["modes"].get(mode, {}).get("share", 0.0 if v["calls"] else None)) for v in versions]
        lines.append(f"| {mode} | {m['count']} | {_pct(m['share'])} | " + " | ".join(per) + " |")
    lines += ["", "Calls per version: " + ", ".join(f"{_version(v['version'])} {v['calls']}" for v in versions), ""]
    lines += ["## Examples", ""]
    for mode, m in report["modes"].items():
        lines.append(
            f"- **{mode}**: "
            + "; ".join(
                f"session `{e['session_id']}` (`{e['completion_id']}`) {json.dumps(e['detail'])[:120]}"
                for e in m["examples"]
            )
        )
    return "\n".join([*lines, ""])


def plot(report: dict[str, Any], path: Path) -> None:
    """Each mode's share of calls per adapter version (one line per mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = report["versions"]
    labels = [_version(v["version"]) for v in versions]
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in report["modes"]:
        shares = [100 * (v["modes"].get(mode, {}).get("share") or 0.0) for v in versions]
        ax.plot(labels, shares, marker="o", label=mode)
    ax.set_xlabel("adapter version")
    ax.set_ylabel("share of calls (%)")
    ax.set_title(f"failure modes per version: {report['project']}")
    if report["modes"]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """mine.json, mine.md and mine.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "mine.json", out / "mine.md", out / "mine.png"]
    paths[0].write_text(json.dumps(report, indent=2, default=str) + "\n")
    paths[1].write_text(markdown(report))
    plot(report, paths[2])
    return paths
