"""FastAPI dependencies shared by every router: who is calling, and a database session.

Routes declare what they need with these ``Annotated`` aliases instead of reaching
into ``request.app.state``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from proxy.auth import Principal
from proxy.errors import Forbidden, NotFound
from storage.models import NO_NUL

if TYPE_CHECKING:
    from proxy.state import AppState


def app_state(request: Request) -> AppState:
    return request.app.state.onthejob  # type: ignore[no-any-return]


async def current_principal(request: Request) -> Principal:
    client = request.client.host if request.client else None
    headers = request.headers
    return await app_state(request).auth.admit(headers.get("authorization"), headers.get("x-api-key"), client)


async def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("this route needs an admin key: create one with `onthejob keys create --role admin`")
    return principal


def operator_gate(setting: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency enforcing ``settings.<setting>``: "open", "admin" (the operator's key) or "off" (404)."""

    async def gate(request: Request) -> None:
        st = app_state(request)
        access = getattr(st.settings, setting)
        if access == "open":
            return
        if access == "off":
            raise NotFound(f"not served here (ONTHEJOB_{setting.upper()}=off)")
        principal = await current_principal(request)
        if principal.role != "admin" or principal.project_id != st.settings.default_project:
            raise Forbidden(
                f"this route needs an admin key of project {st.settings.default_project!r} "
                f"(ONTHEJOB_{setting.upper()}=admin; 'open' serves it to anyone)"
            )

    return gate


async def db_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with app_state(request).sessionmaker() as session:
        yield session


# Ids in paths and queries: bounded, and never a NUL (Postgres text cannot hold one); documented in the spec.
MAX_ID = 200
PathId = Annotated[str, Path(max_length=MAX_ID, pattern=NO_NUL)]
QueryId = Annotated[str | None, Query(max_length=MAX_ID, pattern=NO_NUL)]

StateDep = Annotated["AppState", Depends(app_state)]
PrincipalDep = Annotated[Principal, Depends(current_principal)]
AdminDep = Annotated[Principal, Depends(require_admin)]
DbDep = Annotated[AsyncSession, Depends(db_session)]
