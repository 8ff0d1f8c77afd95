"""``onthejob export``: graded trajectories as JSONL for TRL (SFT, DPO) or our RL format.

* ``sft``: ``{"messages": [...]}``, TRL's conversational language-modeling format
  (the whole conversation of a trajectory, its last reply included).
* ``dpo``: ``{"prompt": [...], "chosen": [...], "rejected": [...]}``, TRL's
  conversational preference format. Pairs come from one group (the ``n > 1``
  choices of a call, or the sessions of one task): its better trajectories
  against its worse ones, split where the two conversations part.
* ``rl``: token ids, mask, behaviour logprobs, reward, adapters, group: what our
  trainer reads (``reward_detail`` as a JSON string so every row has one schema).

Eval-tagged, ungraded, masked and unusable trajectories are never exported;
every exclusion is counted and printed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage.grading import Exclusion, training_exclusion
from storage.trajectories import Trajectory, column, trajectory_to_dict

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

Conversation = list[dict[str, Any]]
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "n")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return str(content)


def normalise_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """Role and text content, plus tool calls / tool call id where present."""
    out: dict[str, Any] = {"role": str(message.get("role", "user")), "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if message.get("tool_call_id"):
        out["tool_call_id"] = str(message["tool_call_id"])
    return out


def conversation(traj: Trajectory, calls: Mapping[str, Any]) -> Conversation | None:
    """The chat a trajectory ends with: the last call's messages plus its reply; None if not chat."""
    if not traj.turns:
        return None
    turn = traj.turns[-1]
    call = calls.get(turn.completion_id)
    if call is None or column(call, "endpoint") != "chat":
        return None
    messages = (column(call, "request") or {}).get("messages")
    choices = sorted(column(call, "choices") or [], key=lambda c: c.get("index", 0))
    if not isinstance(messages, list) or turn.choice_index >= len(choices):
        return None
    reply = choices[turn.choice_index].get("message") or {"role": "assistant", "content": ""}
    return [normalise_message(m) for m in [*messages, reply]]


def exportable(traj: Trajectory, min_reward: float | None) -> Exclusion | None:
    """Why a trajectory is left out of any export, or None."""
    reason = training_exclusion(traj, used=())
    if reason is None and min_reward is not None and traj.reward is not None and traj.reward < min_reward:
        reason = Exclusion.BELOW_MIN_REWARD
    return reason


def sft_rows(
    trajectories: Sequence[Trajectory], calls: Mapping[str, Any], min_reward: float | None = None
) -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
    for traj in trajectories:
        reason = exportable(traj, min_reward)
        conv = conversation(traj, calls) if reason is None else None
        if reason is None and conv is None:
            reason = Exclusion.NOT_CHAT
        if reason is not None:
            excluded[reason] += 1
            continue
        rows.append({"messages": conv})
    return rows, excluded


def _split(a: Conversation, b: Conversation) -> int:
    """Length of the shared prompt: the common prefix, backed up to where both go on with an assistant turn."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    while n > 0 and not (n < len(a) and n < len(b) and a[n]["role"] == b[n]["role"] == "assistant"):
        n -= 1
    return n


def dpo_rows(
    trajectories: Sequence[Trajectory], calls: Mapping[str, Any], min_reward: float | None = None
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Within each group, the best against the worst, the second best against the second worst, ..."""
    excluded: Counter[str] = Counter()
    groups: dict[str, list[tuple[float, Trajectory, Conversation]]] = {}
    for traj in trajectories:
        reason = exportable(traj, None)
        conv = conversation(traj, calls) if reason is None else None
        if reason is None and conv is None:
            reason = Exclusion.NOT_CHAT
        elif reason is None and traj.group is None:
            reason = Exclusion.NO_GROUP
        if reason is not None:
            excluded[reason] += 1
            continue
        assert traj.reward is not None and conv is not None and traj.group is not None
        groups.setdefault(traj.group, []).append((traj.reward, traj, conv))
    rows: list[dict[str, Any]] = []
    for members in groups.values():
        members.sort(key=lambda m: (-m[0], m[1].id))
        paired = 0
        for (good, _, chosen), (bad, _, rejected) in zip(members, reversed(members), strict=False):
            if good <= bad or (min_reward is not None and good < min_reward):
                break
            cut = _split(chosen, rejected)
            if cut == 0:
                excluded["no_shared_prompt"] += 2
                continue
            rows.append({"prompt": chosen[:cut], "chosen": chosen[cut:], "rejected": rejected[cut:]})
            paired += 2
        excluded["unpaired"] += len(members) - paired
    if not excluded["unpaired"]:
        del excluded["unpaired"]
    return rows, excluded


def rl_row(traj: Trajectory) -> dict[str, Any]:
    row = trajectory_to_dict(traj)
    row["reward_detail"] = json.dumps(traj.reward_detail, default=str, sort_keys=True)
    for turn in row["turns"]:
        s = turn["sampling"]
        turn["sampling"] = {k: s.get(k) for k in SAMPLING_KEYS}
        for k in ("temperature", "top_p", "min_p"):
            if turn["sampling"][k] is not None:
                turn["sampling"][k] = float(turn["sampling"][k])
    return row


def rl_rows(
    trajectories: Sequence[Trajectory], calls: Mapping[str, Any], min_reward: float | None = None
) -> tuple[list[dict[str, Any]], Counter[str]]:
    rows: list[dict[str, Any]] = []
    excluded: Counter[str] = Counter()
    for traj in trajectories:
        reason = exportable(traj, min_reward)
        if reason is not None:
            excluded[reason] += 1
        else:
            rows.append(rl_row(traj))
    return rows, excluded


FORMATS = {"sft": sft_rows, "dpo": dpo_rows, "rl": rl_rows}


def parse_since(text: str | None) -> datetime | None:
    """An ISO time; without a zone it is UTC."""
    if not text:
        return None
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def export_rows(
    db: Session,
    project_id: str,
    fmt: str,
    *,
    alias: str | None = None,
    since: datetime | None = None,
    min_reward: float | None = None,
    dataset: str | None = None,
) -> tuple[list[dict[str, Any]], int, Counter[str]]:
    """The rows of one format for a project's trajectories, how many trajectories were read, exclusions.

    ``dataset``: that dataset's pinned trajectories and rewards instead (alias and since do not apply).
    """
    from storage.dataset_load import pinned
    from storage.loaders import load_with_calls

    left_out: Counter[str] = Counter()
    if dataset is not None:
        calls, trajectories, left_out = pinned(db, project_id, dataset)
    else:
        calls, trajectories = load_with_calls(db, project_id, alias=alias, since=since)
    rows, excluded = FORMATS[fmt](trajectories, {c.id: c for c in calls}, min_reward)
    return rows, len(trajectories), excluded + left_out
