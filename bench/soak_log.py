"""What the soak (bench/soak.py) saw, and the checks it makes of it at the end.

Everything is stamped with ``time.time()`` (the proxy, Postgres and this process share one clock).
A call is *excused* from being recorded when a delete of its session (or of its end user) was
answered 200 after the call was sent: it may have been made before the delete (dropped) or after
(kept); either is right. A call answered before a delete was *sent* must be gone afterwards; one
sent after a delete was answered must be recorded (tombstones drop only calls made before them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPLICA_REFUSAL = "no engine replica may serve "


@dataclass
class Call:
    """One call to the proxy (a chat call, a probe, feedback, a delete, a deployment, a read)."""

    kind: str
    session: str | None
    user: str | None
    t_sent: float
    t_done: float = 0.0
    status: int = 0  # 0: no answer (connection error, timeout)
    rid: str | None = None  # x-request-id: the completion's id
    complete: bool = False  # a 200 received in full ([DONE] and no error event, for a stream)
    body: bytes = b""  # kept for non-2xx answers only
    content_type: str = ""
    dialect: str = "openai"
    detail: str = ""


@dataclass
class Batch:
    """What the trainer's ``_next_batch`` handed out: (session, completion ids) per trajectory."""

    t_start: float
    items: list[tuple[str, list[str]]]
    final: bool = False


@dataclass
class Log:
    calls: list[Call] = field(default_factory=list)
    deletes: list[Call] = field(default_factory=list)
    deploys: list[Call] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    health: list[tuple[float, str, frozenset[str]]] = field(default_factory=list)  # (t, stub, models listed)
    publishes: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)  # exceptions in the soak's own actors
    figures: dict[str, Any] = field(default_factory=dict)  # what the checks counted besides their failures

    def answers(self) -> list[Call]:
        return [*self.calls, *self.deletes, *self.deploys]


def user_of(session: str) -> str | None:
    """Sessions ``customer-<k>`` with even k belong to end user ``user-<k>``; odd ones to nobody."""
    k = int(session.rsplit("-", 1)[1])
    return f"user-{k}" if k % 2 == 0 else None


def _hits(d: Call, session: str) -> bool:
    return d.status == 200 and (d.session == session if d.kind == "delete_session" else d.user == user_of(session))


def excused(call: Call, deletes: list[Call]) -> bool:
    return call.session is not None and any(_hits(d, call.session) and d.t_done >= call.t_sent for d in deletes)


def surely_deleted(call: Call, deletes: list[Call]) -> Call | None:
    """A delete of the call's session sent after the call was answered, if any."""
    if call.session is None:
        return None
    return next((d for d in deletes if _hits(d, call.session) and d.t_sent > call.t_done), None)


def envelope_ok(c: Call) -> bool:
    """A non-2xx answer in its dialect's error shape (JSON, never plain text)."""
    if "json" not in c.content_type:
        return False
    try:
        body = orjson.loads(c.body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    err = body["error"]
    if c.dialect == "anthropic":
        return body.get("type") == "error" and isinstance(err.get("type"), str) and isinstance(err.get("message"), str)
    return isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


def describe(c: Call) -> str:
    return (
        f"{c.kind} session={c.session} user={c.user} status={c.status} id={c.rid} "
        f"sent=+{c.t_sent:.2f} answered=+{c.t_done:.2f} {c.detail} {c.body[:160]!r}"
    )


def check(log: Log, rows: set[str], adapters: list[dict[str, Any]], t0: float) -> dict[str, dict[str, Any]]:
    """Each invariant: ok, how many were looked at, the failures (a few described)."""
    from trainer.publish import content_sha256

    def rel(c: Call) -> Call:  # times relative to the start, for reading
        return Call(**{**c.__dict__, "t_sent": c.t_sent - t0, "t_done": c.t_done - t0})

    out: dict[str, dict[str, Any]] = {}
    acked = [c for c in log.calls if c.complete and c.rid]
    lost = [c for c in acked if c.rid not in rows and not excused(c, log.deletes)]
    out["every_200_recorded_or_deleted"] = _result(len(acked), lost, rel)
    landed = [(c, d) for c in acked if c.rid in rows and (d := surely_deleted(c, log.deletes)) is not None]
    out["no_deleted_call_landed"] = _result(len(acked), [c for c, _ in landed], rel)

    after = [c for c in acked if c.session and any(_hits(d, c.session) and d.t_done < c.t_sent for d in log.deletes)]
    log.figures["calls_dropped_by_a_later_delete"] = sum(1 for c in acked if c.rid not in rows) - len(lost)
    log.figures["calls_sent_after_their_session_was_deleted"] = len(after)
    log.figures["of_those_recorded"] = sum(1 for c in after if c.rid in rows)

    by_rid = {c.rid: c for c in acked}
    trained: list[Call] = []
    items = kept = 0
    for batch in log.batches:
        for session, completion_ids in batch.items:
            items += 1
            done = [d for d in log.deletes if _hits(d, session) and d.t_done < batch.t_start]
            kept += bool(done)
            for cid in completion_ids:
                call = by_rid.get(cid)
                if call is not None and any(call.t_done < d.t_sent for d in done):
                    trained.append(Call(**{**call.__dict__, "detail": f"in a batch at +{batch.t_start - t0:.2f}"}))
                    break
    out["no_deleted_session_in_a_batch"] = _result(items, trained, rel)
    log.figures["batch_items_of_a_session_deleted_before_the_batch"] = kept  # made of later calls: rightly kept

    bad: list[Call] = []
    for a in adapters:
        if a["state"] != "committed":
            continue
        try:
            ok = content_sha256(Path(a["path"])) == a["sha256"]
        except Exception as exc:  # noqa: BLE001 - a missing folder is a failure, described
            ok, a = False, {**a, "error": str(exc)}
        if not ok:
            bad.append(Call("adapter", None, None, t0, t0, detail=str(a)))
    paths = Counter(a["path"] for a in adapters)
    bad += [Call("adapter", None, None, t0, t0, detail=f"shared path {p}") for p, n in paths.items() if n > 1]
    out["every_adapter_folder_hashes_to_its_sha256"] = _result(len(adapters), bad, rel)

    silent = [c for c in log.answers() if c.status == 0]  # no answer at all: a connection error or the timeout
    log.figures["requests_without_an_answer"] = len(silent)
    log.figures["without_an_answer_e.g."] = [describe(rel(c)) for c in silent[:3]]
    errors = [c for c in log.answers() if c.status >= 300]
    out["no_plain_text_error_body"] = _result(len(errors), [c for c in errors if not envelope_ok(c)], rel)

    refused = [c for c in errors if REPLICA_REFUSAL.encode() in c.body]
    wrongly = [c for c in refused if _healthy_replica(log, c)]
    deploys_failed = [c for c in log.deploys if c.status != 201 and _db_up(log, c)]
    out["no_replica_refusal_while_one_was_healthy"] = _result(
        len(refused) + len(log.deploys), wrongly + deploys_failed, rel
    )
    return out


def _healthy_replica(log: Log, c: Call) -> bool:
    """Whether some stub listed the refused model (it answered /v1/models with it) around the call."""
    served = c.body.split(REPLICA_REFUSAL.encode(), 1)[1].split(b'"', 1)[0].decode()
    return any(c.t_sent - 1.0 <= t <= c.t_done and served in models for t, _, models in log.health)


def _db_up(log: Log, c: Call) -> bool:
    down, up = log.marks.get("database stopped"), log.marks.get("database started")
    return down is None or up is None or not (down - 1 <= c.t_done and c.t_sent <= up + 5)


def _result(looked: int, failures: list[Call], rel: Any) -> dict[str, Any]:
    return {
        "ok": not failures,
        "checked": looked,
        "failures": len(failures),
        "examples": [describe(rel(c)) for c in failures[:5]],
    }
