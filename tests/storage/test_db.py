from __future__ import annotations

import pytest

from storage.db import DatabaseUrlError, normalise


@pytest.mark.parametrize(
    ("url", "sync", "async_"),
    [
        ("postgresql://u:p@h:5432/d", "postgresql+psycopg://u:p@h:5432/d", "postgresql+psycopg://u:p@h:5432/d"),
        ("postgres://h/d", "postgresql+psycopg://h/d", "postgresql+psycopg://h/d"),
        ("postgresql+psycopg2://h/d", "postgresql+psycopg://h/d", "postgresql+psycopg://h/d"),
        ("sqlite:///x.db", "sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    ],
)
def test_urls_pick_the_driver(url: str, sync: str, async_: str) -> None:
    assert normalise(url, asynchronous=False) == sync
    assert normalise(url, asynchronous=True) == async_


def test_unsupported_url_names_the_accepted_forms() -> None:
    with pytest.raises(DatabaseUrlError, match="postgresql://"):
        normalise("mysql://h/d", asynchronous=False)


def test_json_scalars_round_trip_on_sqlite(tmp_path: object) -> None:
    """A numeric feedback value is a bare JSON number; SQLite returns it as a number, not text."""
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.migrate import upgrade
    from storage.models import Feedback, Project

    url = f"sqlite:///{tmp_path}/j.db"  # type: ignore[str-bytes-safe]
    upgrade(url)
    eng = sync_engine(url)
    with Session(eng) as db:
        db.add(Project(id="p", settings={}))
        db.flush()
        for i, value in enumerate([0.8, 3, True, "success", None]):
            db.add(
                Feedback(
                    id=f"f{i}",
                    project_id="p",
                    idempotency_key=f"k{i}",
                    target_kind="session_id",
                    target_id="s",
                    name="reward",
                    value=value,
                    comment="c",
                    meta={"n": 1},
                )
            )
        db.commit()
    with Session(eng) as db:
        values = [f.value for f in db.query(Feedback).order_by(Feedback.id)]
    eng.dispose()
    assert values == [0.8, 3, True, "success", None]
