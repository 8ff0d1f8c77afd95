"""Other workers' spools on this host, read for records not in the database yet.

With ``serve --workers N`` a follow-up call may reach another worker than its parent,
and a dialect call may continue a call by id that another worker served, before either
record has drained (~50 ms). Each worker can read its siblings' spool folders (``w-…``
beside its own), and never writes there:

- a parent by link key: in each sibling's *link index* (:data:`LINKS`, one short line per
  recorded call: :func:`link_line`), its newest ``budget`` bytes. What a lookup reads is
  bounded by the number of recent calls, not their size: a coding agent's call is hundreds of
  kilobytes, and a scan of the records themselves found one or two of them in 2 MiB;
- a call by id (or any other bytes): in each sibling's newest ``budget`` bytes of records,
  newest file first (the spool's layout is :func:`proxy.spool._newest_first`'s).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import orjson

from storage.records import CallRecord

SIBLING_SCAN_BYTES = 2 * 1024 * 1024
LINKS = "links.idx"  # a spool folder's link index
LINK_SCAN_BYTES = 64 * 1024  # of each sibling's index a lookup reads: ~300 recent calls


class LinkEntry(NamedTuple):
    """What the link index holds of a recorded call: what a follow-up needs to continue it."""

    link_key: str
    project_id: str
    session_id: str
    id: str
    task_id: str | None
    end_user: str | None
    created_at: str


def link_line(record: CallRecord) -> bytes:
    """A record's link index line (nothing for a call no follow-up can continue). Begins with the key:
    ``["<link key>",`` (keys are hex digests: no escapes), so a reader ranks a line before parsing it."""
    if record.link_key is None:
        return b""
    entry = (record.link_key, record.project_id, record.session_id, record.id, record.task_id)
    return orjson.dumps([*entry, record.end_user, record.created_at]) + b"\n"


class Siblings:
    """The spool folders beside ``folder`` (this worker's), listed again every 5 s."""

    def __init__(self, folder: Path, newest_first: Callable[[Path], Iterator[Path]]) -> None:
        self.folder = folder
        self.newest_first = newest_first  # a spool folder's files, newest first
        self._folders: list[Path] = []
        self._listed_until = 0.0

    def links(self, link_keys: list[str], budget: int = LINK_SCAN_BYTES) -> Iterator[LinkEntry]:
        """Entries of other workers' link indexes with one of these link keys: keys in priority order,
        for each the newest entry first. Reads the newest ``budget`` bytes of each sibling's index (each
        its own budget: one busy sibling never hides another's newest calls). Nothing to do with one
        worker. A line is parsed only when its key is wanted."""
        rank = {key.encode(): i for i, key in enumerate(link_keys)}
        found: list[tuple[int, int, int, bytes]] = []  # (key's rank, sibling, newest line first, line)
        for folder_no, folder in enumerate(self._sibling_folders()):
            try:
                with (folder / LINKS).open("rb") as handle:
                    size = handle.seek(0, os.SEEK_END)
                    start = handle.seek(max(0, size - budget))
                    data = handle.read(budget)
            except OSError:
                continue  # no index (a worker gone, its folder adopted)
            first = data.find(b"\n") + 1 if start else 0  # a read that began mid-line skips that line
            end = data.rfind(b"\n")  # what follows the last newline is mid-write
            for line_no, line in enumerate(reversed(data[first:end].split(b"\n") if end >= first else [])):
                close = line.find(b'"', 2)
                hit = rank.get(line[2:close]) if line.startswith(b'["') and close > 0 else None
                if hit is not None:
                    found.append((hit, folder_no, line_no, line))
        for *_, line in sorted(found, key=lambda hit: hit[:3]):
            try:
                yield LinkEntry(*orjson.loads(line))
            except (ValueError, TypeError):  # a torn or foreign line
                continue

    def matching(
        self, needles: list[bytes], budget: int = SIBLING_SCAN_BYTES, *, own: bool = False
    ) -> Iterator[CallRecord]:
        """Records in other workers' spools (and, with ``own``, then in this one's) whose line holds
        one of ``needles`` (in that order, newest first). ``budget`` bounds the bytes read of each
        sibling, and this worker's: a deep backlog in one spool never hides another's record."""
        chunks = self._chunks(budget, own=own)
        for needle in needles:
            for data, first in chunks:
                yield from _decoded(_lines_holding(data, needle, first))

    def _sibling_folders(self) -> list[Path]:
        """The other workers' spool folders (listed again every 5 s)."""
        now = time.monotonic()
        if now > self._listed_until:
            self._folders = [f for f in self.folder.parent.glob("w-*") if f != self.folder]
            self._listed_until = now + 5.0
        return self._folders

    def _chunks(self, budget: int, *, own: bool) -> list[tuple[bytes, int]]:
        """The newest ``budget`` bytes of each sibling's spool (newest file first; and this worker's with
        ``own``), each with where its first whole line starts (a read that began mid-line skips that
        line's tail; not copied off: a second buffer of 2 MiB a call cost more than the search)."""
        chunks: list[tuple[bytes, int]] = []
        for folder in [*self._sibling_folders(), *([self.folder] if own else [])]:
            left = budget  # each folder its own: one sibling's backlog never hides another's newest records
            for file in self.newest_first(folder):
                if left <= 0:
                    break
                try:
                    with file.open("rb") as handle:
                        size = handle.seek(0, os.SEEK_END)
                        start = handle.seek(max(0, size - left))
                        data = handle.read(left)
                except OSError:
                    continue  # sealed or drained meanwhile
                left -= len(data)
                chunks.append((data, data.find(b"\n") + 1 if start else 0))
        return chunks


def _lines_holding(data: bytes, needle: bytes, first: int = 0) -> Iterator[bytes]:
    """The complete lines of ``data`` from ``first`` on that contain ``needle``, last first (a tail may be
    mid-write)."""
    at = data.rfind(needle, first)
    while at >= 0:
        start, end = data.rfind(b"\n", first, at) + 1 or first, data.find(b"\n", at)
        if end > 0:
            yield data[start:end]
        at = data.rfind(needle, first, start)


def _decoded(lines: Iterable[bytes]) -> Iterator[CallRecord]:
    for line in lines:
        try:
            yield CallRecord.decode(line)
        except ValueError:  # orjson.JSONDecodeError included: a torn or foreign line
            pass
