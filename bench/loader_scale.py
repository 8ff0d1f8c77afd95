"""One trainer poll's cost as recorded history grows: 10k, 100k, 1M calls with feedback.

Fills a separate database (``--database``, dropped and made again) through the bulk
path the recorder uses (storage/bulk.py: COPY of calls, one upsert of their sessions;
feedback by COPY too). Sessions are four linked calls (prompts growing 40 → 112 ids,
16 sampled ids each); 85% graded at session level, 10% ungraded, 5% held out.

At each size the trainer's feed is put at the end of the log (caught up), then a fixed
increment lands: ``--increment`` calls (half continue old sessions, half start new ones)
and a grade for each session touched. One poll is timed, then a second increment's poll
is run under tracemalloc for its peak Python memory. With ``--full-upto N`` the old
whole-history ``load_training_batch`` is timed too at sizes up to N, for contrast.

Also measured first, alternating A/B in one run: what the change-log trigger adds to
recording (COPY of 2,000 calls per batch with the trigger on and off).

Run: ``python -m bench.loader_scale [--sizes 10000,100000,1000000] [--full-upto 100000]``.
Prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from storage import bulk
from storage.changes import await_horizon, latest_position
from storage.db import sync_engine
from storage.feed import TrainingFeed
from storage.loaders import load_training_batch
from storage.migrate import upgrade
from storage.records import CallRecord

PROJECT, ALIAS, TURNS = "bench", "agent", 4
SAMPLED = list(range(200, 216))
AFTER = [2, 3, 1, 13, 3, 60, 2, 3]  # the template's glue and a tool result after each assistant turn
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FEEDBACK_COLUMNS = (
    "id",
    "project_id",
    "idempotency_key",
    "target_kind",
    "target_id",
    "completion_id",
    "session_id",
    "name",
    "value",
    "comment",
    "source",
    "metadata",
    "created_at",
    "attached_at",
)


def _turn_json() -> tuple[list[bytes], list[bytes]]:
    """Prompt ids and request of each turn (one more than a filled session has: a continued session's)."""
    prompts, requests = [], []
    prompt = [1, 10, 3, *range(100, 134), 2, 3, 1, 12, 3]  # 40 ids
    messages: list[dict[str, Any]] = [{"role": "user", "content": "question"}]
    for _ in range(TURNS + 1):
        prompts.append(orjson.dumps(prompt))
        requests.append(orjson.dumps({"model": ALIAS, "messages": messages}))
        prompt = prompt + SAMPLED + AFTER
        messages = [*messages, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "42"}]
    return prompts, requests


PROMPTS, REQUESTS = _turn_json()
CHOICES = orjson.dumps(
    [
        {
            "index": 0,
            "token_ids": SAMPLED,
            "logprobs": [-0.5] * 16,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "x"},
        }
    ]
)
SAMPLING = orjson.dumps({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16})
TAGS = {"": b"[]", "eval": b'["eval"]'}


def call(session: int, turn: int, at: int) -> CallRecord:
    """Turn ``turn`` of session ``session`` (every 20th session is held out)."""
    sid = f"s{session:08d}"
    return CallRecord(
        id=f"c{session:08d}-{turn}",
        project_id=PROJECT,
        session_id=sid,
        task_id=f"task{session % 500}",
        client_request_id=None,
        upstream_id=None,
        endpoint="chat",
        dialect="chat",
        client_request=b"null",
        client_response=b"null",
        alias=ALIAS,
        served_model="base",
        adapter_version=None,
        tags=TAGS["eval" if session % 20 == 0 else ""],
        request=REQUESTS[turn],
        response=b"{}",
        prompt_token_ids=PROMPTS[turn],
        choices=CHOICES,
        sampling=SAMPLING,
        usage=b"null",
        status_code=200,
        termination="stop",
        error=None,
        stream=False,
        link_key=None,
        parent_id=f"c{session:08d}-{turn - 1}" if turn else None,
        created_at=(T0 + timedelta(milliseconds=at)).isoformat(),
        latency_ms=1.0,
        ttft_ms=1.0,
        session_source="header",
    )


def grade(session: int, n: int, at: int) -> tuple[Any, ...]:
    """A session-level outcome (``n`` makes revisions distinct items)."""
    fid = f"fb-{session:08d}-{n}"
    value = b'"success"' if (session + n) % 3 else b'"failure"'
    when = (T0 + timedelta(milliseconds=at)).isoformat()
    sid = f"s{session:08d}"
    return (
        fid,
        PROJECT,
        fid,
        "session_id",
        sid,
        None,
        sid,
        "outcome",
        value.decode(),
        None,
        "harness",
        "{}",
        when,
        when,
    )


async def write(conn: psycopg.AsyncConnection[Any], calls: list[CallRecord], grades: list[tuple[Any, ...]]) -> None:
    """One recorder-like transaction: sessions upserted, calls COPYed (storage/bulk.py), then grades COPYed."""
    async with conn.transaction():
        await bulk.insert_projects(conn, [PROJECT])
        if calls:
            await bulk.upsert_sessions(conn, bulk.sessions_json(list({c.session_id: c for c in calls}.values())))
            await bulk.copy_completions(conn, calls)
        if grades:
            copy = f"COPY feedback ({', '.join(FEEDBACK_COLUMNS)}) FROM STDIN"
            async with conn.cursor() as cur, cur.copy(copy) as cp:
                for g in grades:
                    await cp.write_row(g)


def history(first_session: int, sessions: int) -> Iterator[tuple[list[CallRecord], list[tuple[Any, ...]]]]:
    """Whole sessions in batches of 500 (2,000 calls), graded but for every 10th."""
    for start in range(first_session, first_session + sessions, 500):
        ids = range(start, min(start + 500, first_session + sessions))
        calls = [call(s, t, s * 10 + t) for s in ids for t in range(TURNS)]
        grades = [grade(s, 0, s * 10 + 5) for s in ids if s % 10 != 1]
        yield calls, grades


async def fill(url: str, first_session: int, sessions: int) -> float:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        started = time.perf_counter()
        for calls, grades in history(first_session, sessions):
            await write(conn, calls, grades)
        seconds = time.perf_counter() - started
        await conn.execute("ANALYZE")  # as autovacuum would by then: plans from real statistics
        await conn.commit()
        return seconds


async def increment(url: str, known: int, new_first: int, calls: int, rng: random.Random, n: int) -> None:
    """Half the calls continue old sessions (a fifth turn and on), half start new two-turn sessions; all graded."""
    old = rng.sample(range(known), calls // 2)
    fresh = range(new_first, new_first + calls // 4)
    at = new_first * 10
    records = [call(s, t, at + i) for i, (s, t) in enumerate([(s, 0) for s in fresh] + [(s, 1) for s in fresh])]
    for s in old:  # a continued session: one more turn after its last
        record = call(s, TURNS, at)
        record.id = f"c{s:08d}-x{n}"
        records.append(record)
    grades = [grade(s, n, at + 1) for s in [*old, *fresh]]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await write(conn, records, grades)


async def trigger_cost(url: str, rounds: int = 4) -> dict[str, float]:
    """µs per recorded call with the change-log trigger on and off, alternating, 2,000 calls a batch."""
    out: dict[str, list[float]] = {"on": [], "off": []}
    session = 90_000_000
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for r in range(rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                state = "ENABLE" if mode == "on" else "DISABLE"
                await conn.execute(f"ALTER TABLE completions {state} TRIGGER completions_log_changes")
                calls = [call(s, t, 0) for s in range(session, session + 500) for t in range(TURNS)]
                session += 500
                started = time.perf_counter()
                await write(conn, calls, [])
                out[mode].append((time.perf_counter() - started) / len(calls) * 1e6)
        await conn.execute("ALTER TABLE completions ENABLE TRIGGER completions_log_changes")
    on, off = statistics.median(out["on"]), statistics.median(out["off"])
    return {
        "trigger_on_us_per_call": round(on, 1),
        "trigger_off_us_per_call": round(off, 1),
        "added_us_per_call": round(on - off, 1),
    }


def poll_once(db: Session, feed: TrainingFeed, traced: bool) -> dict[str, float]:
    await_horizon(db, PROJECT, 30)
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    batch, excluded = feed.poll(db)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    if traced:
        tracemalloc.stop()
    db.rollback()
    return {"seconds": seconds, "peak_mb": peak / 2**20, "handed_out": len(batch), "read": sum(excluded.values())}


def measure(url: str, size_sessions: int, calls: int, full_upto: int, rng: random.Random, first: int) -> dict[str, Any]:
    """Two increments (numbered ``first`` and ``first + 1``: distinct ids and feedback items), one poll each."""
    engine = sync_engine(url)
    try:
        with Session(engine) as db:
            await_horizon(db, PROJECT, 30)
            feed = TrainingFeed(PROJECT, ALIAS, limit=10_000, pages=50)
            feed.position = feed.saved = latest_position(db, PROJECT)  # caught up with the history
            poll_once(db, feed, traced=False)  # warm: SQLAlchemy compiles each statement once per process
            out: dict[str, Any] = {"calls": size_sessions * TURNS, "sessions": size_sessions, "increment": calls}
            for n, traced in ((first, False), (first + 1, True)):
                asyncio.run(increment(url, size_sessions, 50_000_000 + n * 100_000, calls, rng, n))
                result = poll_once(db, feed, traced)
                key = "peak" if traced else "poll"
                out[f"{key}_s" if not traced else "peak_mb"] = round(result["peak_mb" if traced else "seconds"], 4)
                out[f"{key}_handed_out"] = result["handed_out"]
            if size_sessions * TURNS <= full_upto:
                started = time.perf_counter()
                batch, _ = load_training_batch(db, PROJECT, ALIAS)
                out["full_rebuild_s"] = round(time.perf_counter() - started, 2)
                out["full_rebuild_trajectories"] = len(batch)
                db.rollback()
            return out
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="onthejob_bench_loader")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="recorded calls at each measurement")
    parser.add_argument("--increment", type=int, default=200, help="calls landing between two polls")
    parser.add_argument("--full-upto", type=int, default=0, help="also time load_training_batch up to this size")
    args = parser.parse_args()
    admin = create_engine(make_url(args.admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{args.database}"'))
    admin.dispose()
    url = make_url(args.admin).set(database=args.database).render_as_string(hide_password=False)
    upgrade(url)
    print(orjson.dumps({"recording": asyncio.run(trigger_cost(url))}).decode(), flush=True)
    rng = random.Random(0)
    filled = 0
    for i, size in enumerate(int(s) for s in args.sizes.split(",")):
        sessions = size // TURNS
        seconds = asyncio.run(fill(url, filled, sessions - filled))
        print(orjson.dumps({"filled_calls": size, "fill_s": round(seconds, 1)}).decode(), flush=True)
        filled = sessions
        result = measure(url, sessions, args.increment, args.full_upto, rng, 2 * i + 1)
        print(orjson.dumps(result).decode(), flush=True)


if __name__ == "__main__":
    main()
