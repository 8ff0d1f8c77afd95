"""A client for route tests whose key check and database session are the test's: the project and
role come from ``x-test-project``/``x-test-role`` headers (``as_``), each request gets its own session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.pool import NullPool

from proxy.auth import Principal
from proxy.deps import current_principal, db_session
from storage.db import async_engine


@asynccontextmanager
async def header_client(app: FastAPI, pg_url: str, base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    eng = async_engine(pg_url, poolclass=NullPool)
    maker = async_sessionmaker(eng, expire_on_commit=False)

    async def principal(request: Request) -> Principal:
        return Principal(project_id=request.headers["x-test-project"], role=request.headers["x-test-role"], key_id=None)

    async def session() -> AsyncIterator[AsyncSession]:
        async with maker() as db:
            yield db

    app.dependency_overrides[current_principal] = principal
    app.dependency_overrides[db_session] = session
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url) as c:
            yield c
    finally:
        await eng.dispose()


def as_(project: str, role: str = "admin") -> dict[str, str]:
    return {"x-test-project": project, "x-test-role": role}
