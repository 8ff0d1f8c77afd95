"""What the dashboard reads about promotion and datasets, for any key of the project (read-only).

The admin routes (proxy/routes_promotion.py, routes_datasets.py) answer the same questions one
alias or dataset at a time and carry what only an operator needs (per-item eval scores, replica
URLs). The page wants, in one request each: every alias's policy, decisions, evals per version
and attested versions; every dataset with the versions trained from it; one dataset's items.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DbSession

from storage import datasets, lineage
from storage import promotion as store
from storage.models import Alias, Attestation

MAX_ALIASES = 20
# An eval's per-item scores can hold 100,000 entries: the page shows mean ± s.e., not the items.
EVAL_FIELDS = ("id", "alias", "version", "name", "grader", "n", "mean", "stderr", "source", "created_at")


def promotions(db: DbSession, project: str, alias: str | None) -> list[dict[str, Any]]:
    """Per alias (or the one asked for): policy, decisions oldest first, evals, attested versions."""
    query = select(Alias.name).where(Alias.project_id == project)
    if alias:
        query = query.where(Alias.name == alias)
    out = []
    for name in db.scalars(query.order_by(Alias.name).limit(MAX_ALIASES)):
        decisions = [
            {**store.event_to_dict(e), "t": e.created_at.timestamp()} for e in store.list_events(db, project, name)
        ]
        evals = [
            {k: v for k, v in store.eval_to_dict(e).items() if k in EVAL_FIELDS}
            for e in store.list_evals(db, project, name)
        ]
        attested = db.scalars(
            select(Attestation)
            .where(Attestation.project_id == project, Attestation.alias == name)
            .order_by(Attestation.version)
        ).all()
        out.append(
            {
                "alias": name,
                "policy": store.get_policy(db, project, name).to_dict(),
                "decisions": decisions,
                "evals": evals,
                "attestations": [
                    {"version": a.version, "sha256": a.sha256, "created_at": a.created_at.isoformat()} for a in attested
                ],
            }
        )
    return out


def dataset_list(db: DbSession, project: str) -> list[dict[str, Any]]:
    """Every dataset (items still alive counted) with the adapter versions trained from it."""
    trained = lineage.dataset_versions(db, project)
    return [{**d, "versions": trained.get(d["name"], [])} for d in datasets.list_datasets(db, project)]


def dataset_page(db: DbSession, project: str, name: str, offset: int, limit: int) -> dict[str, Any]:
    """One dataset: its summary, ``limit`` of its items from ``offset``, the versions trained from it.

    Raises storage.datasets.DatasetNotFound when the project has no such dataset.
    """
    shown = datasets.show(db, project, name)
    items = shown.pop("items")
    return {
        **shown,
        "items": items[offset : offset + limit],
        "offset": offset,
        "total_items": len(items),
        "versions": lineage.dataset_versions(db, project).get(name, []),
    }
