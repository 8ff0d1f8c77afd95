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


MIN_CHOSEN_SECRET = 24  # characters of an operator-chosen key (ONTHEJOB_ADMIN_KEY)
MAKE_ONE = "make one with: python -c 'import secrets; print(\"otj-\" + secrets.token_urlsafe(32))'"


def create_key(
    db: DbSession, project_id: str, role: str = "harness", name: str = "", secret: str | None = None
) -> NewKey:
    """Create a key for a project (created if missing); the caller commits.

    ``secret``: adopt an operator-chosen secret instead of generating one (see :func:`ensure_key`).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    ensure_project(db, project_id)
    secret = secret or KEY_PREFIX + secrets.token_urlsafe(32)
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


def check_chosen_secret(secret: str) -> None:
    """An operator-chosen key must be long enough to be a secret; the message says how to make one."""
    if "change-me" in secret:
        raise ValueError(f"ONTHEJOB_ADMIN_KEY is still the placeholder from .env.example; {MAKE_ONE}")
    if len(secret) < MIN_CHOSEN_SECRET or secret.strip() != secret:
        raise ValueError(
            f"ONTHEJOB_ADMIN_KEY must be at least {MIN_CHOSEN_SECRET} characters without surrounding spaces; {MAKE_ONE}"
        )


def ensure_key(db: DbSession, project_id: str, secret: str, role: str = "admin", name: str = "from-env") -> bool:
    """Make ``secret`` a key of ``project_id`` unless it is one already; True when created.

    Idempotent, so a proxy can run it at every start (docker compose: one ``.env`` value
    serves the proxy and the trainer). A revoked key stays revoked: revoking it is how an
    operator retires it, and a restart must not bring it back.
    """
    check_chosen_secret(secret)
    row = db.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    if row is not None:
        if row.project_id != project_id or row.role != role:
            raise ValueError(f"that key already exists as a {row.role} key of project {row.project_id!r}")
        return False
    create_key(db, project_id, role, name, secret=secret)
    return True


def find_key(db: DbSession, secret: str) -> ApiKey | None:
    """The live key row for a secret, or None."""
    row = db.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row
