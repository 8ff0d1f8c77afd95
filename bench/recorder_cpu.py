"""The recorder's database write alone: CPU per 1,000 records, in this process and in its Postgres backend.

No proxy, no load generator: records shaped like bench/proxy_overhead.py's calls (one
call per new session, 16 prompt and 16 sampled ids with logprobs, as the stub answers)
are written in batches through :meth:`proxy.recorder.Recorder._write`, the path a drain
takes, into a throwaway database migrated to head. What this process and the
recorder's Postgres backend spent is read from the OS, so the figures hold up on a
busy machine far better than a rate does. ``--sql`` runs statements first (to try a
schema change: ``--sql "ALTER TABLE completions DISABLE TRIGGER completions_log_changes"``).

Run: ``python -m bench.recorder_cpu [--batches 200] [--batch 150] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import uvloop
from sqlalchemy.ext.asyncio import async_sessionmaker

from bench.harness import proc_cpu, throwaway_database
from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.spool import Spool
from storage.db import async_engine
from storage.migrate import upgrade
from storage.records import CallRecord

REQUEST = b'{"model":"stub-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
RESPONSE = (
    b'{"id":"stub-1","object":"chat.completion","created":1796142658,"model":"stub-model","choices":['
    b'{"index":0,"finish_reason":"length","stop_reason":null,"token_ids":null,"logprobs":null,"message":{"role":'
    b'"assistant","content":"xxxxxxxxxxxxxxxx"}}],"usage":{"prompt_tokens":16,"completion_tokens":16,'
    b'"total_tokens":32},"prompt_token_ids":null,"system_fingerprint":"stub"}'
)
CHOICES = (
    b'[{"index":0,"token_ids":['
    + b",".join(str(i).encode() for i in range(100, 116))
    + b'],"logprobs":['
    + b",".join([b"-0.5"] * 16)
    + b'],"finish_reason":"length","message":{"role":"assistant","content":'
    b'"xxxxxxxxxxxxxxxx"}}]'
)
SAMPLING = b'{"max_tokens":16,"temperature":1.0,"top_p":1.0,"top_k":-1,"min_p":0.0,"n":1}'
USAGE = b'{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32}'
PROMPT = b"[" + b",".join(str(i).encode() for i in range(1, 17)) + b"]"


def record() -> CallRecord:
    """One call as the proxy records the bench's request (a new session each)."""
    return CallRecord(
        id=f"cmpl-{uuid.uuid4().hex}",
        project_id="default",
        session_id=f"ses_{uuid.uuid4().hex}",
        task_id=None,
        client_request_id=None,
        upstream_id="stub-1",
        endpoint="chat",
        dialect="chat",
        client_request=b"null",
        client_response=b"null",
        alias="stub-model",
        served_model="stub-model",
        adapter_version=None,
        tags=b"[]",
        request=REQUEST,
        response=RESPONSE,
        prompt_token_ids=PROMPT,
        choices=CHOICES,
        sampling=SAMPLING,
        usage=USAGE,
        status_code=200,
        termination="length",
        error=None,
        stream=False,
        link_key=uuid.uuid4().hex * 2,
        parent_id=None,
        created_at=datetime.now(UTC).isoformat(),
        latency_ms=1.1,
        ttft_ms=1.0,
        session_source="new",
    )


async def run(db_url: str, batches: int, size: int) -> tuple[float, float]:
    """CPU seconds per 1,000 records: (this process, the recorder's Postgres backend)."""
    engine = async_engine(db_url, pool_size=1, max_overflow=1)
    spool = Spool(Path(tempfile.mkdtemp(prefix="onthejob-recorder-cpu-")), 1 << 30)
    recorder = Recorder(spool, async_sessionmaker(engine, expire_on_commit=False), Metrics(), size)
    try:
        await recorder._write([record()])  # connect, insert the project
        assert recorder._pg_conn is not None, "the Postgres path was not taken"
        backend = recorder._pg_conn.info.backend_pid
        work = [[record() for _ in range(size)] for _ in range(batches)]
        me0, pg0 = time.process_time(), proc_cpu(backend)
        for batch in work:
            await recorder._write(batch)
        me, pg = time.process_time() - me0, proc_cpu(backend) - pg0
    finally:
        await recorder.close()
        spool.close()
        await engine.dispose()
    n = batches * size
    return me / n * 1000, pg / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=150, help="records per batch (~50 ms of 3,000 req/s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs, each on a fresh database; medians printed")
    parser.add_argument("--sql", action="append", default=[], help="statements to run after migrating")
    args = parser.parse_args()
    mine, theirs = [], []
    for _ in range(args.repeat):
        with throwaway_database() as db_url:
            upgrade(db_url)
            with psycopg.connect(db_url, autocommit=True) as conn:
                for stmt in args.sql:
                    conn.execute(stmt)
            me, pg = uvloop.run(run(db_url, args.batches, args.batch))
        print(f"  recorder {me:.4f}  postgres backend {pg:.4f} CPU s/1k records", flush=True)
        mine.append(me)
        theirs.append(pg)
    print(
        f"median: recorder {statistics.median(mine):.4f}, postgres backend {statistics.median(theirs):.4f} "
        f"CPU s per 1k records ({args.batches} batches of {args.batch})"
    )


if __name__ == "__main__":
    main()
