"""Drain a filled spool into Postgres with the proxy's own Recorder and time it (the drain rate).

compare_proxies.py fills the spool by serving calls through ``onthejob serve`` while
its database is unreachable, stops it, then runs this (pinned like the proxy) on
the same folder. Prints one JSON object: records, bytes, seconds, records/s.

Run: ``python -m bench.drain --spool DIR --db postgresql://...``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson
from sqlalchemy.ext.asyncio import async_sessionmaker

from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.settings import Settings
from proxy.spool import Spool
from proxy.spool_folders import absorb_orphans, claim
from storage.db import async_engine


async def drain(spool_dir: Path, db_url: str) -> dict[str, float]:
    settings = Settings(upstreams=["http://127.0.0.1:1"], database_url=db_url, spool_dir=spool_dir)
    engine = async_engine(db_url, pool_size=5, max_overflow=5)
    folder, _lock = claim(spool_dir)  # the folder a proxy worker left, as a restarted proxy adopts it
    spool = Spool(folder, settings.spool_max_bytes)
    absorb_orphans(spool)  # the other workers' folders, if it ran several
    recorder = Recorder(spool, async_sessionmaker(engine, expire_on_commit=False), Metrics(), settings.drain_batch)
    records, size = spool.depth, spool.bytes
    if not records:
        raise RuntimeError(f"no spooled records under {spool_dir}: the fill step recorded nothing")
    t0 = time.perf_counter()
    while spool.depth > 0:
        if await recorder.drain_once() == 0:
            raise RuntimeError(f"drain made no progress with {spool.depth} records left")
    seconds = time.perf_counter() - t0
    await recorder.close()
    spool.close()
    await engine.dispose()
    return {"records": records, "bytes": size, "seconds": seconds, "records_per_s": records / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spool", required=True, type=Path)
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    try:
        import uvloop

        result = uvloop.run(drain(args.spool, args.db))
    except ImportError:
        result = asyncio.run(drain(args.spool, args.db))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
