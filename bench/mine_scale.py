"""``onthejob mine``'s first pass over a filled database: wall time and the process's peak memory.

Fill a database the way bench/loader_scale.py does (the recorder's bulk path), then run one
pass from an empty cursor and report. Run once per size, each in its own process, so the
peak resident size (``ru_maxrss``) is that pass's:

    python -m bench.mine_scale --fill 100000 --database onthejob_bench_mine_100k
    python -m bench.mine_scale --database onthejob_bench_loader      # an already filled one

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

import orjson
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from bench.loader_scale import PROJECT, TURNS, fill
from storage.db import sync_engine
from storage.migrate import upgrade
from storage.mine_store import mine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", required=True)
    parser.add_argument("--fill", type=int, default=0, help="make the database and record this many calls first")
    parser.add_argument("--no-upgrade", action="store_true", help="the database's schema is already current")
    args = parser.parse_args()
    url = make_url(args.admin).set(database=args.database).render_as_string(hide_password=False)
    out: dict[str, object] = {"database": args.database}
    if args.fill:
        admin = create_engine(make_url(args.admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{args.database}"'))
        admin.dispose()
        upgrade(url)
        out["fill_s"] = round(asyncio.run(fill(url, 0, args.fill // TURNS)), 1)
    elif not args.no_upgrade:
        upgrade(url)  # an older bench database: the flags table
    engine = sync_engine(url)
    with Session(engine) as db:
        db.execute(text("DELETE FROM change_cursors WHERE consumer = 'mine'"))
        db.execute(text("DELETE FROM completion_flags"))
        db.commit()
        calls = db.scalar(text("SELECT count(*) FROM completions"))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        done = mine(db, PROJECT, settle_s=60)
        out.update(
            calls=calls,
            read_calls=done.calls,
            read_feedback=done.feedback,
            flagged=dict(done.flagged),
            mine_s=round(time.perf_counter() - started, 1),
            rss_before_mb=round(before / 1024, 1),
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        )
    engine.dispose()
    print(orjson.dumps(out).decode(), flush=True)


if __name__ == "__main__":
    main()
