"""Trajectory assembly: a session's linked calls → token sequences with a sampling mask.

Pure functions over completion rows (ORM objects or plain dicts with the columns
of ``completions``); loading them lives in :mod:`storage.loaders`.

A session's calls form a tree through ``parent_id`` (the earlier call whose
request messages plus returned assistant message are a prefix of this call's
messages). Every leaf, and every unextended choice of an ``n > 1`` call, is one
trajectory; retries, parallel sub-agents and prompts that do not extend the
previous one therefore become separate trajectories.

The token sequence is the first prompt's ids, then each call's sampled ids
(mask 1, behaviour logprobs aligned), then the part of the next call's prompt
after the re-rendered assistant turn (mask 0: tool results, user turns). We
never re-tokenize: where ids are missing the trajectory is flagged instead.
Locating the end of the re-rendered assistant turn in the next prompt (:mod:`storage.alignment`):

1. the sampled ids themselves, when the template reproduced them exactly;
2. else ``render(messages_before, assistant_message)``, the turn as the chat
   template renders it (see :func:`chat_template_render`);
3. else the first end-of-turn token after the previous prompt: given, or
   inferred from the session's prompts (a token whose count grows by exactly
   the number of messages each linked call added, e.g. ``<|im_end|>``, and
   that the model never sampled mid-turn); among several candidates, the one
   whose span is closest in length to the sampled ids.

When the span found differs from the sampled ids (the tiny model's invalid
UTF-8 comes back as U+FFFD, tool calls re-rendered), the sampled ids are kept,
the differing tokens are counted in ``mismatches`` and the trajectory is
flagged ``rerender_mismatch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from storage.alignment import infer_end_of_turn, locate_turn_end

# (messages before the assistant turn, the assistant message) -> that turn's ids as the
# template renders it inside a later prompt, through its end-of-turn token.
Render = Callable[[list[dict[str, Any]], dict[str, Any]], list[int]]

# Flags that make a trajectory unusable for training; load_training_batch excludes and counts them.
# "redacted": the proxy masked ids that spelled a secret (proxy/redact_tokens.py); first, as it explains the rest.
UNUSABLE_FLAGS = ("redacted", "missing_token_ids", "prefix_mismatch", "unaligned")
# Terminations that cut a call short; the flag has the same name.
CUT_SHORT = ("client_disconnected", "timeout", "upstream_error", "rejected")


@dataclass
class Turn:
    """One sampled segment of a trajectory: which call produced tokens [start, end)."""

    completion_id: str
    choice_index: int
    start: int
    end: int
    adapter_version: int | None  # None: the base model served it
    served_model: str
    # Effective sampling parameters of the call: {"temperature", "top_p", "top_k", ...}.
    sampling: dict[str, Any]


@dataclass
class Trajectory:
    """Token-exact training data for one branch of one session (docs/architecture.md, "The objectives")."""

    id: str
    project_id: str
    session_id: str
    task_id: str | None
    alias: str
    token_ids: list[int]
    mask: list[int]  # 1 only where the model sampled the token
    logprobs: list[float | None]  # behaviour logprobs aligned to token_ids; None where mask is 0 or missing
    turns: list[Turn]
    completion_ids: list[str]
    reward: float | None = None  # None: excluded from training (never treated as 0)
    reward_detail: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # e.g. "missing_logprobs", "truncated", "client_disconnected"
    tags: list[str] = field(default_factory=list)  # e.g. "eval": never trained on
    group: str | None = None  # task id, or "<completion_id>" for the n>1 choices of one call
    mismatches: int = 0  # re-rendered assistant tokens that differed from the sampled ids

    @property
    def adapters(self) -> list[int | None]:
        """Adapter version per turn."""
        return [t.adapter_version for t in self.turns]


def trajectory_to_dict(traj: Trajectory) -> dict[str, Any]:
    """JSON-ready form (the REST answer and the RL export row)."""
    out = dataclasses.asdict(traj)
    out["adapters"] = traj.adapters
    return out


def trajectory_id(completion_id: str, choice_index: int) -> str:
    """Stable id: the leaf call and choice determine the whole branch."""
    return f"{completion_id}:{choice_index}"


@dataclass(frozen=True)
class CallRow:
    """The columns of one completion row that assembly reads."""

    id: str
    project_id: str
    session_id: str
    task_id: str | None
    alias: str
    served_model: str
    adapter_version: int | None
    tags: tuple[str, ...]
    messages: list[dict[str, Any]] | None
    prompt_ids: list[int] | None
    choices: list[dict[str, Any]]
    sampling: dict[str, Any]
    termination: str
    parent_id: str | None
    created_at: datetime | None


def column(row: Any, name: str, default: Any = None) -> Any:
    """Read a column from an ORM object, a SQLAlchemy Row or a dict."""
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def to_call(row: Any) -> CallRow:
    """Normalise one completion row."""
    request = column(row, "request") or {}
    messages = request.get("messages") if isinstance(request, Mapping) else None
    choices = sorted(column(row, "choices") or [], key=lambda c: c.get("index", 0))
    return CallRow(
        id=column(row, "id"),
        project_id=column(row, "project_id", ""),
        session_id=column(row, "session_id", ""),
        task_id=column(row, "task_id"),
        alias=column(row, "alias", ""),
        served_model=column(row, "served_model", ""),
        adapter_version=column(row, "adapter_version"),
        tags=tuple(column(row, "tags") or ()),
        messages=list(messages) if isinstance(messages, list) else None,
        prompt_ids=column(row, "prompt_token_ids"),
        choices=list(choices),
        sampling=dict(column(row, "sampling") or {}),
        termination=column(row, "termination", "stop") or "stop",
        parent_id=column(row, "parent_id"),
        created_at=column(row, "created_at"),
    )


# --------------------------------------------------------------------------- branches


Branch = list[tuple[CallRow, int | None]]  # (call, choice index); None: the call returned no choice


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("content") or "") == (b.get("content") or "") and (a.get("tool_calls") or None) == (
        b.get("tool_calls") or None
    )


def extended_choice(parent: CallRow, child: CallRow) -> int:
    """Which choice of ``parent`` the child's prompt continues (matters only when n > 1)."""
    if len(parent.choices) <= 1:
        return 0
    if parent.messages is not None and child.messages is not None and len(child.messages) > len(parent.messages):
        reply = child.messages[len(parent.messages)]
        for i, choice in enumerate(parent.choices):
            if isinstance(choice.get("message"), Mapping) and _same_message(choice["message"], reply):
                return i
    if parent.prompt_ids is not None and child.prompt_ids is not None:
        start = len(parent.prompt_ids)
        for i, choice in enumerate(parent.choices):
            ids = choice.get("token_ids") or []
            if ids and child.prompt_ids[start : start + len(ids)] == ids:
                return i
    return 0


def branches(calls: Sequence[CallRow]) -> list[Branch]:
    """Every root-to-leaf path of a session's call tree, one per unextended choice."""
    by_id = {c.id: c for c in calls}
    children: dict[tuple[str, int], list[CallRow]] = {}
    roots: list[CallRow] = []
    for call in calls:
        parent = by_id.get(call.parent_id) if call.parent_id else None
        if parent is None or parent.id == call.id:
            roots.append(call)
        else:
            children.setdefault((parent.id, extended_choice(parent, call)), []).append(call)
    for key, kids in children.items():
        # A call that returned nothing (rejected, upstream error) ends a branch only when
        # nothing else continues there; beside a retry it would just repeat its parent.
        children[key] = [kid for kid in kids if kid.choices] or kids
    paths: list[Branch] = []
    # Iterative depth-first walk: sessions can be hundreds of turns deep.
    stack: list[tuple[CallRow, Branch]] = [(root, []) for root in reversed(roots)]
    seen: set[str] = set()
    while stack:
        call, prefix = stack.pop()
        if call.id in seen:  # a parent cycle in bad data: never loop
            continue
        seen.add(call.id)
        indices: list[int | None] = list(range(len(call.choices))) or [None]
        pending: list[tuple[CallRow, Branch]] = []
        for k in indices:
            path = [*prefix, (call, k)]
            kids = children.get((call.id, k), []) if k is not None else []
            if not kids:
                paths.append(path)
            pending.extend((kid, path) for kid in kids)
        stack.extend(reversed(pending))
    return paths


def _assistant_message(call: CallRow, choice: Mapping[str, Any]) -> dict[str, Any]:
    message = choice.get("message")
    if isinstance(message, Mapping):
        return dict(message)
    return {"role": "assistant", "content": choice.get("text") or ""}


# --------------------------------------------------------------------------- assembly


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def build_trajectory(path: Branch, *, render: Render | None = None, end_of_turn: Collection[int] = ()) -> Trajectory:
    """One trajectory from one root-to-leaf path."""
    first, last = path[0][0], path[-1][0]
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    turns: list[Turn] = []
    flags: list[str] = []
    mismatches = 0
    if first.parent_id is not None:
        flags.append("missing_parent")  # the earlier call has not landed; its turn is prompt context here
    if first.prompt_ids is None:
        flags.append("missing_token_ids")
    else:
        tokens += first.prompt_ids
        mask += [0] * len(first.prompt_ids)
        logprobs += [None] * len(first.prompt_ids)
    for j, (call, k) in enumerate(path):
        if call.termination in CUT_SHORT:
            flags.append(call.termination)
        if k is None:
            continue  # a call that returned nothing (rejected, upstream error): always a leaf
        choice = call.choices[k]
        sampled = choice.get("token_ids")
        lps = choice.get("logprobs")
        if choice.get("redacted") or choice.get("redacted_prompt"):
            flags.append("redacted")
        if sampled is None:
            flags.append("missing_token_ids")
            sampled = []
        if sampled and (lps is None or len(lps) != len(sampled)):
            flags.append("missing_logprobs")
            lps = None
        if choice.get("finish_reason") == "length":
            flags.append("truncated")
        start = len(tokens)
        tokens += sampled
        mask += [1] * len(sampled)
        logprobs += list(lps) if lps is not None else [None] * len(sampled)
        turns.append(Turn(call.id, k, start, len(tokens), call.adapter_version, call.served_model, dict(call.sampling)))
        if j + 1 == len(path):
            break
        nxt = path[j + 1][0]
        if call.prompt_ids is None or nxt.prompt_ids is None or choice.get("token_ids") is None:
            flags.append("missing_token_ids")
            continue
        if list(nxt.prompt_ids[: len(call.prompt_ids)]) != list(call.prompt_ids):
            # The template re-rendered earlier history (e.g. stripped reasoning): the
            # concatenation is not what the model saw for the later turns.
            flags.append("prefix_mismatch")
        rendered = None
        if render is not None and call.messages is not None:
            rendered = render(list(call.messages), _assistant_message(call, choice))
        end, differing = locate_turn_end(
            call.prompt_ids, sampled, nxt.prompt_ids, rendered=rendered, end_of_turn=end_of_turn
        )
        mismatches += differing
        if end is None:
            flags.append("unaligned")
            end = len(call.prompt_ids) + len(sampled)  # best guess; unusable for training anyway
        elif differing:
            flags.append("rerender_mismatch")
        rest = list(nxt.prompt_ids[end:])
        tokens += rest
        mask += [0] * len(rest)
        logprobs += [None] * len(rest)
    group = next((c.id for c, _ in path if len(c.choices) > 1), None)
    task = next((c.task_id for c, _ in reversed(path) if c.task_id), None)
    leaf_choice = path[-1][1]
    return Trajectory(
        id=trajectory_id(last.id, leaf_choice if leaf_choice is not None else 0),
        project_id=last.project_id,
        session_id=last.session_id,
        task_id=task,
        alias=last.alias,
        token_ids=tokens,
        mask=mask,
        logprobs=logprobs,
        turns=turns,
        completion_ids=[c.id for c, _ in path],
        flags=_dedupe(flags),
        tags=_dedupe(str(t) for c, _ in path for t in c.tags),
        group=group or task,
        mismatches=mismatches,
    )


def assemble_session(
    rows: Iterable[Any], *, render: Render | None = None, end_of_turn: Collection[int] | None = None
) -> list[Trajectory]:
    """All trajectories of one session's completion rows (any order)."""
    calls = [to_call(r) for r in rows]
    if all(c.created_at is not None for c in calls):
        calls.sort(key=lambda c: (c.created_at, c.id))
    eot = frozenset(end_of_turn) if end_of_turn else infer_end_of_turn(calls)
    return [build_trajectory(p, render=render, end_of_turn=eot) for p in branches(calls)]


def assemble(
    rows: Iterable[Any], *, render: Render | None = None, end_of_turn: Collection[int] | None = None
) -> list[Trajectory]:
    """Trajectories of completion rows from any number of sessions, session by session."""
    sessions: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        sessions.setdefault((column(row, "project_id", ""), column(row, "session_id", "")), []).append(row)
    out: list[Trajectory] = []
    for session_rows in sessions.values():
        out += assemble_session(session_rows, render=render, end_of_turn=end_of_turn)
    return out


def chat_template_render(tokenizer: Any) -> Render:
    """A :data:`Render` from a Hugging Face tokenizer's chat template (the trainer has one)."""
    eos = tokenizer.eos_token_id

    def ids(messages: list[dict[str, Any]], **kw: Any) -> list[int]:
        out = tokenizer.apply_chat_template(messages, tokenize=True, **kw)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)

    def render(before: list[dict[str, Any]], assistant: dict[str, Any]) -> list[int]:
        head = ids(before, add_generation_prompt=True)
        full = ids([*before, assistant])
        if full[: len(head)] != head:
            return []
        turn = full[len(head) :]
        # Stop at the end-of-turn token: what follows it is glue between messages.
        if eos is not None and eos in turn:
            turn = turn[: len(turn) - turn[::-1].index(eos)]
        return turn

    return render
