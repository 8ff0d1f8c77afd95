"""API keys: random secrets shown once, stored as sha256 hashes, looked up by hash."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage.models import ApiKey, Project

ROLES = ("harness", "admin")
KEY_PREFIX = "otj-"


def hash_key(secret: str) -> str:
    """The stored form of a key; keys are 32 random bytes, so a plain sha256 suffices."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    id: str
    project_id: str
    role: str
    secret: str  # shown once, never stored


def ensure_project(db: DbSession, project_id: str) -> Project:
    """Get or create a project row."""
    project = db.get(Project, project_id)
    if project is None:
        project = Project(id=project_id, settings={})
        db.add(project)
        db.flush()
    return project


def create_key(db: DbSession, project_id: str, role: str = "harness", name: str = "") -> NewKey:
    """Create a key for a project (created if missing); the caller commits."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    ensure_project(db, project_id)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id="key_" + secrets.token_hex(8),
        project_id=project_id,
        name=name,
        role=role,
        prefix=secret[:10],
        key_hash=hash_key(secret),
    )
    db.add(key)
    db.flush()
    return NewKey(id=key.id, project_id=project_id, role=role, secret=secret)


def find_key(db: DbSession, secret: str) -> ApiKey | None:
    """The live key row for a secret, or None."""
    row = db.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row
