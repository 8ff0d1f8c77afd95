"""The call record: one definition for the spool line, the COPY row and the SQLAlchemy row."""

from __future__ import annotations

from datetime import datetime

import orjson

from storage.models import Completion
from storage.records import COLUMNS, JSON_FIELDS, CallRecord, link_needle
from tests.proxy.records import record


def test_the_record_holds_exactly_the_completion_columns() -> None:
    assert set(COLUMNS) == set(Completion.__table__.columns.keys())
    assert set(JSON_FIELDS) == {c.name for c in Completion.__table__.columns if c.type.__class__.__name__ == "JSON"}


def test_the_spool_line_writes_every_column_once_and_reads_back_equal() -> None:
    rec = record(2, tags=["x"])
    line = rec.encode()
    obj = orjson.loads(line)
    assert list(obj["completion"]) == list(COLUMNS)  # the spelt-out encoder misses none
    assert obj["session"] == {"project_id": "p", "id": "ses_2", "task_id": None, "source": "header", "tags": ["x"]}
    assert CallRecord.decode(line) == rec
    assert b"\n" not in line and link_needle(rec.link_key or "") in line


def test_an_older_line_without_some_json_columns_reads_with_the_models_defaults() -> None:
    obj = orjson.loads(record(1).encode())
    for name in ("tags", "usage", "sampling"):
        del obj["completion"][name]
    rec = CallRecord.decode(orjson.dumps(obj))
    assert (rec.tags, rec.usage, rec.sampling) == (b"[]", b"null", b"{}")


def test_rows_carry_the_same_values_for_copy_and_for_sqlalchemy() -> None:
    rec = record(0)
    copy, row = rec.copy_row(), rec.row()
    assert list(row) == list(COLUMNS) and len(copy) == len(COLUMNS)
    for name, text in zip(COLUMNS, copy, strict=True):
        if name in JSON_FIELDS:
            assert orjson.loads(text) == row[name]  # the text serialised once, when the call was recorded
        elif name == "created_at":
            assert datetime.fromisoformat(text) == row[name]
        else:
            assert text == row[name]
    assert rec.session_row()["tags"] == ["a", "ü"]
