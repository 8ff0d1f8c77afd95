"""The dashboard over 100,000 recorded calls: each view's time to first meaningful paint in headless Chromium.

Fills a database of its own (``onthejob_bench_ui`` unless ``--db-name``; kept for the next
run, refilled only when its call count differs) through the recorder's bulk path
(storage/bulk.py: COPY for completions, one upsert for sessions): ``--calls`` calls in
sessions of 5 turns over two aliases and three adapter versions, every third call
graded, one eval-tagged session in fifty, deployments and a training run of 50 steps,
then ``VACUUM ANALYZE`` (a bulk load has no statistics or visibility map yet; a database
that grew over weeks has both, from autovacuum).
Then starts the stub engine and the proxy, opens each view in a fresh page load and
reads the page's own mark: ``window.onthejobReady.t``, milliseconds from navigation
start until the view's data is on screen (the key check, the API calls, the render).

Run: ``.venv/bin/python -m bench.ui_paint`` (Postgres on 127.0.0.1:5432; Chromium and
chromedriver from the system's packages). Goal: <= 1000 ms per view.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg import AsyncConnection

from bench import peers
from bench.harness import machine_description
from storage import bulk
from storage.migrate import upgrade
from storage.records import CallRecord, dump_json

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TURNS = 5
ALIASES = ("support", "triage")
BATCH = 5000


def _call(i: int, calls: int, start: datetime) -> CallRecord:
    rnd = random.Random(i)
    session, turn = divmod(i, TURNS)
    alias = ALIASES[session % 2]
    version = min(3, i * 4 // calls) or None  # base, then v1, v2, v3 as the deployments below say
    eval_tag = session % 50 == 0
    prompt = [rnd.randrange(50_000) for _ in range(48 + 16 * turn)]
    ids = [rnd.randrange(50_000) for _ in range(24)]
    messages = [{"role": "user", "content": f"question {session} turn {turn} " + "x" * 80}]
    reply = {"role": "assistant", "content": "answer " + "y" * 60}
    termination = "stop" if i % 97 else "timeout"
    return CallRecord(
        id=f"cmpl-bench{i:08d}",
        project_id="default",
        session_id=f"bench-s{session:06d}",
        task_id=None,
        client_request_id=None,
        upstream_id=None,
        endpoint="chat",
        dialect="chat" if i % 10 else "responses",
        client_request=b"null",
        client_response=b"null",
        alias=alias,
        served_model=f"{alias}@v{version}" if version else "base",
        adapter_version=version,
        tags=dump_json(["eval"] if eval_tag else []),
        request=dump_json({"model": alias, "messages": messages}),
        response=dump_json({"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]}),
        prompt_token_ids=dump_json(prompt),
        choices=dump_json(
            [
                {
                    "index": 0,
                    "token_ids": ids,
                    "logprobs": [-rnd.random() for _ in ids],
                    "finish_reason": "stop",
                    "message": reply,
                }
            ]
        ),
        sampling=dump_json({"temperature": 1.0}),
        usage=dump_json({"prompt_tokens": len(prompt), "completion_tokens": len(ids)}),
        status_code=200,
        termination=termination,
        error=None,
        stream=bool(i % 2),
        link_key=None,
        parent_id=f"cmpl-bench{i - 1:08d}" if turn else None,
        created_at=(start + timedelta(seconds=6 * i)).isoformat(),
        latency_ms=40.0 + rnd.random() * 100,
        ttft_ms=None,
        session_source="header",
    )


async def fill(db_url: str, calls: int) -> float:
    """Insert ``calls`` calls (bulk path), feedback on every third, deployments and a run; returns seconds."""
    t0 = time.perf_counter()
    start = datetime.now(UTC) - timedelta(seconds=6 * calls)
    async with await AsyncConnection.connect(db_url) as conn:
        await bulk.insert_projects(conn, ["default"])
        for lo in range(0, calls, BATCH):
            batch = [_call(i, calls, start) for i in range(lo, min(calls, lo + BATCH))]
            async with conn.transaction():
                await bulk.upsert_sessions(conn, bulk.sessions_json(list({c.session_id: c for c in batch}.values())))
                await bulk.copy_completions(conn, batch)
        async with (
            conn.cursor() as cur,
            cur.copy(
                "COPY feedback (id, project_id, idempotency_key, target_kind, target_id, completion_id, session_id,"
                " name, value, comment, source, metadata, created_at, attached_at) FROM STDIN"
            ) as copy,
        ):
            for i in range(0, calls, 3):
                cid, sid = f"cmpl-bench{i:08d}", f"bench-s{i // TURNS:06d}"
                when = (start + timedelta(seconds=6 * i + 30)).isoformat()
                value = "1" if i % 2 else "0" if i % 5 else "-1"
                await copy.write_row(
                    (
                        f"fb-bench{i:08d}",
                        "default",
                        f"fb-bench{i:08d}",
                        "completion_id",
                        cid,
                        cid,
                        sid,
                        "reward",
                        value,
                        None,
                        "harness",
                        "{}",
                        when,
                        when,
                    )
                )
        for alias in ALIASES:  # v1, v2, v3 deployed where _call switches versions
            for v in (1, 2, 3):
                when = start + timedelta(seconds=6 * (v * calls // 4))
                await conn.execute(
                    "INSERT INTO deployments (project_id, alias, version, previous_version, status, detail,"
                    " created_at) VALUES ('default', %s, %s, %s, 'active', '{}', %s)",
                    [alias, v, v - 1 or None, when],
                )
        run = await (
            await conn.execute(
                "INSERT INTO training_runs (project_id, alias, objective, base_model, config, status, started_at)"
                " VALUES ('default', 'support', 'grpo', 'base', '{}', 'finished', now()) RETURNING id"
            )
        ).fetchone()
        assert run is not None
        await conn.execute(
            "INSERT INTO training_steps (run_id, step, adapter_version, metrics, created_at) SELECT %s, s, s / 17 + 1,"
            " json_build_object('loss', 1.0 / s, 'reward_mean', s / 50.0, 'ratio_mean', 1.0, 'ratio_max', 1.5,"
            " 'excluded', json_build_object('ungraded', s)), now() FROM generate_series(1, 50) AS s",
            [run[0]],
        )
        await conn.commit()
    return time.perf_counter() - t0


def ensure_database(name: str, calls: int, refill: bool) -> tuple[str, float | None]:
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(url)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM completions").fetchone()
    if row is not None and row[0] == calls and not refill:
        return url, None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE completions, sessions, feedback, deployments, training_steps, training_runs CASCADE")
    took = asyncio.run(fill(url, calls))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")  # what autovacuum would have done to a database that grew over weeks
    return url, took


VIEWS = (
    "traffic",
    "traffic?alias=triage&grade=graded",
    "traffic?termination=timeout",
    "sessions",
    "session/bench-s{mid:06d}",
    "call/cmpl-bench{mid_call:08d}",
    "learning",
    "run/{run}",
    "datasets",
    "health",
    "control",
)


def paint_times(proxy_url: str, views: list[str], repeats: int) -> dict[str, list[float]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)
    out: dict[str, list[float]] = {v: [] for v in views}
    try:
        driver.get(f"{proxy_url}/ui")
        driver.execute_script("sessionStorage.setItem('onthejob.key', 'bench')")  # --no-auth: any key
        n = 0
        for _ in range(repeats):
            for view in views:
                n += 1
                driver.get(f"{proxy_url}/ui?load={n}#/{view}")
                name = view.split("/")[0].split("?")[0]
                WebDriverWait(driver, 60).until(
                    lambda d, name=name: d.execute_script("return document.documentElement.dataset.ready") == name
                )
                errors = driver.find_elements("css selector", "#view .notice.error")
                if errors:
                    raise RuntimeError(f"{view}: {errors[0].text}")
                out[view].append(float(driver.execute_script("return window.onthejobReady.t")))
    finally:
        driver.quit()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--db-name", default="onthejob_bench_ui")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--refill", action="store_true", help="fill the database again even if it has --calls")
    args = parser.parse_args()
    print(f"machine: {machine_description()}")
    db_url, filled = ensure_database(args.db_name, args.calls, args.refill)
    print(f"database {args.db_name}: {args.calls} calls " + (f"filled in {filled:.1f} s" if filled else "(kept)"))
    with psycopg.connect(db_url) as conn:
        run = conn.execute("SELECT max(id) FROM training_runs").fetchone()
    mid_call = args.calls // 2
    views = [v.format(mid=mid_call // TURNS, mid_call=mid_call, run=run[0] if run else 1) for v in VIEWS]
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-ui-bench-"))
    stub = peers.stub(logdir, None)
    proxy = peers.onthejob(stub.url, db_url, logdir / "spool", logdir, None, record=True, name="onthejob-ui")
    try:
        times = paint_times(proxy.url, views, args.repeats)
    finally:
        proxy.stop()
        stub.stop()
    print(f"\n{'view':42} {'median ms':>10} {'max ms':>8}  (first meaningful paint, {args.repeats} fresh loads each)")
    worst = 0.0
    for view, ts in times.items():
        worst = max(worst, statistics.median(ts))
        print(f"{view:42} {statistics.median(ts):10.0f} {max(ts):8.0f}")
    print(f"\nslowest view median: {worst:.0f} ms (goal <= 1000 ms): {'met' if worst <= 1000 else 'MISSED'}")


if __name__ == "__main__":
    main()
