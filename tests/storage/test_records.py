"""The call record: one definition for the spool line, the COPY row and the SQLAlchemy row."""

from __future__ import annotations

import re
from datetime import datetime

import orjson
import pytest

from storage.models import Completion
from storage.records import COLUMNS, JSON_FIELDS, CallRecord
from tests.proxy.records import record


def test_the_record_holds_exactly_the_completion_columns() -> None:
    assert set(COLUMNS) == set(Completion.__table__.columns.keys())
    assert set(JSON_FIELDS) == {c.name for c in Completion.__table__.columns if c.type.__class__.__name__ == "JSON"}


def test_the_spool_line_writes_every_column_once_and_reads_back_equal() -> None:
    rec = record(2, tags=["x"])
    line = rec.encode()
    obj = orjson.loads(line)
    assert sorted(obj["completion"]) == sorted(COLUMNS)  # the spelt-out encoder misses none
    assert obj["session"] == {"project_id": "p", "id": "ses_2", "task_id": None, "source": "header", "tags": ["x"]}
    assert CallRecord.decode(line) == rec
    assert b"\n" not in line


def test_an_older_line_without_some_json_columns_reads_with_the_models_defaults() -> None:
    obj = orjson.loads(record(1).encode())
    for name in ("tags", "usage", "sampling"):
        del obj["completion"][name]
    rec = CallRecord.decode(orjson.dumps(obj))
    assert (rec.tags, rec.usage, rec.sampling) == (b"[]", b"null", b"{}")


TRICKY = {
    "error": "tab\tnewline\ncr\r back\\slash \\N",
    "request": {"content": 'a "quote", a \\ and \t\n'},
    "client_request_id": "\\N",
}


def _unescape(field: bytes) -> str | None:
    """A COPY text-format field back to its value (None for ``\\N``)."""
    if field == b"\\N":
        return None
    escapes = {b"t": b"\t", b"n": b"\n", b"r": b"\r", b"\\": b"\\"}
    return re.sub(rb"\\(.)", lambda m: escapes[m.group(1)], field).decode()


@pytest.mark.parametrize("rec", [record(0), record(1), record(2, **TRICKY)], ids=["even", "odd", "escapes"])
def test_the_copy_line_reads_back_as_the_row_column_by_column(rec: CallRecord) -> None:
    line, row = rec.copy_line(), rec.row()
    assert b"\n" not in line and b"\r" not in line
    fields = line.split(b"\t")
    assert list(row) == list(COLUMNS) and len(fields) == len(COLUMNS)
    for name, raw in zip(COLUMNS, fields, strict=True):
        value, expected = _unescape(raw), row[name]
        if name in JSON_FIELDS:
            assert value is not None and orjson.loads(value) == expected  # the text serialised once, when recorded
        elif name == "created_at":
            assert value is not None and datetime.fromisoformat(value) == expected
        elif expected is None or isinstance(expected, str):
            assert value == expected
        elif isinstance(expected, bool):
            assert value == ("t" if expected else "f")
        else:
            assert value is not None and float(value) == expected
    assert rec.session_row()["tags"] == ["a", "ü"]
