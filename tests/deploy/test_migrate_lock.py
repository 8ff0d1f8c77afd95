"""`onthejob db upgrade` under Postgres's advisory lock: the Kubernetes migration Job, a second copy of
it and every proxy replica's upgrade at start take turns instead of racing on the same DDL."""

from __future__ import annotations

import threading
import time

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from storage.db import sync_engine
from storage.migrate import LOCK_KEY, alembic_config, upgrade

WAITERS = """SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND NOT granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def _head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_an_upgrade_waits_for_the_lock_holder_then_finds_the_schema(pg_factory: object) -> None:
    url = pg_factory(migrate=False)  # type: ignore[operator]
    eng = sync_engine(url)
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    try:
        with eng.connect() as holder:  # another migrator, mid-run
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
            holder.commit()
            worker = threading.Thread(target=migrate, daemon=True)
            worker.start()
            with eng.connect() as probe:
                waiting = 0
                while worker.is_alive() and not waiting:
                    waiting = probe.scalar(text(WAITERS)) or 0
                    probe.rollback()
                    time.sleep(0.02)
                # Without the lock the upgrade would have run to the end by now, never waiting.
                assert waiting == 1 and worker.is_alive(), errors
                assert "alembic_version" not in inspect(probe).get_table_names()
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            holder.commit()
        worker.join(timeout=120)
        assert not worker.is_alive() and not errors, errors
        with eng.connect() as conn:
            assert conn.scalar(text("SELECT version_num FROM alembic_version")) == _head()
            assert conn.scalar(text(WAITERS.replace("NOT granted", "granted"))) == 0  # released after the run
    finally:
        eng.dispose()


def test_two_upgrades_at_once_both_succeed(pg_factory: object) -> None:
    url = pg_factory(migrate=False)  # type: ignore[operator]
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=migrate, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors
    eng = sync_engine(url)
    try:
        with eng.connect() as conn:
            assert conn.scalar(text("SELECT version_num FROM alembic_version")) == _head()
    finally:
        eng.dispose()
