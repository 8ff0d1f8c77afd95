"""The declarative base, the column types and conventions every table shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData, text
from sqlalchemy.orm import DeclarativeBase

# Plain JSON, not JSONB: Postgres' JSONB refuses "\u0000", which a model can emit
# (the tiny test model does), and we never query inside these documents.
Json = JSON()
# Text a column may hold: Postgres text cannot hold NUL, so ids, names and labels with one are
# refused with a 400 (the pattern documents it in the API spec, the validators enforce it).
NO_NUL = r"^[^\x00]*$"
PENDING = text("attached_at IS NULL")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now; every stored time is UTC."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: Json, list[Any]: Json, datetime: DateTime(timezone=True)}
