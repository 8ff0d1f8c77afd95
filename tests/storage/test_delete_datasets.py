"""A session deleted and started afresh under the same id belongs in datasets made afterwards.

Its tombstone keeps the items a dataset made before the delete pinned out (tests/storage/test_datasets.py);
a dataset made after it pins the fresh session's items, and shows them. Real Postgres.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from storage import datasets
from storage.datasets import DatasetFilter, Spec
from storage.deletion import delete_session
from tests.storage.rows import GEN, choice, feedback_row, insert, msg, row
from tests.storage.test_datasets import _sessions, _world


def test_a_session_started_afresh_after_its_delete_is_in_a_later_dataset(db: Session) -> None:
    p, _ = _world(db)
    datasets.create(db, p, "before", Spec(DatasetFilter(alias="agent")))
    db.commit()
    delete_session(db, p, "t1-b")
    db.commit()
    insert(
        db,
        row(
            f"{p}-fresh",
            msg("user", 90) + GEN,
            [choice([60, 61, 2], content="ok", logprobs=None)],
            session="t1-b",
            project=p,
            task="t1",
            at=100,
        ),
    )
    db.add(feedback_row(p, "outcome", "success", session="t1-b", at=100))
    db.commit()
    datasets.create(db, p, "after", Spec(DatasetFilter(alias="agent")))
    db.commit()
    assert "t1-b" not in _sessions(datasets.show(db, p, "before"))
    assert "t1-b" in _sessions(datasets.show(db, p, "after"))
