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
