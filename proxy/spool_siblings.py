"""Other workers' spools on this host, read for records not in the database yet.

With ``serve --workers N`` a follow-up call may reach another worker than its parent,
and a dialect call may continue a call by id that another worker served, before either
record has drained (~50 ms). Each worker can read its siblings' spool folders (``w-…``
beside its own); it reads the newest ``budget`` bytes of each, newest file first, and
never writes there. The spool's layout (which file is newest) is
:func:`proxy.spool._newest_first`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from storage.records import LINE_START, CallRecord, link_needle

SIBLING_SCAN_BYTES = 2 * 1024 * 1024


class Siblings:
    """The spool folders beside ``folder`` (this worker's), listed again every 5 s."""

    def __init__(self, folder: Path, newest_first: Callable[[Path], Iterator[Path]]) -> None:
        self.folder = folder
        self.newest_first = newest_first  # a spool folder's files, newest first
        self._folders: list[Path] = []
        self._listed_until = 0.0

    def records(self, link_keys: list[str], budget: int = SIBLING_SCAN_BYTES) -> Iterator[CallRecord]:
        """Records in other workers' spools with one of these link keys.

        Keys in priority order; for each, the newest match first. Reads at most ``budget``
        bytes of each sibling, newest files first (a worker's spool holds ~50 ms of its
        traffic while the database keeps up). Nothing to do with one worker. One pass over
        what was read, whatever the number of keys: a line's link key is its first field (a
        long conversation's twenty candidate keys, each searched for through 2 MiB of long
        records, cost 2.2–2.7 ms a call: ``python -m bench.sibling_scan``).
        """
        rank = {key.encode(): i for i, key in enumerate(link_keys)}
        needles = [(link_needle(key), i) for i, key in enumerate(link_keys)]  # for lines in the older order
        found: list[tuple[int, int, int, bytes]] = []  # (key's rank, newest file first, newest line first, line)
        top = False  # the newest line of the first key is the first answer whatever else is there: given at once
        wanted = set(link_keys)  # an older line holds a needle anywhere (a client's own "link_key" field too)
        for file_no, (data, first) in enumerate(self._chunks(budget, own=False)):
            for line_no, (hit, line) in enumerate(_keyed_lines(data, first, rank, needles)):
                if hit == 0 and not top:
                    top = True
                    yield from (r for r in _decoded([line]) if r.link_key in wanted)
                else:
                    found.append((hit, file_no, line_no, line))
        lines = [line for *_, line in sorted(found, key=lambda hit: hit[:3])]
        yield from (r for r in _decoded(lines) if r.link_key in wanted)

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

    def _chunks(self, budget: int, *, own: bool) -> list[tuple[bytes, int]]:
        """The newest ``budget`` bytes of each sibling's spool (newest file first; and this worker's with
        ``own``), each with where its first whole line starts (a read that began mid-line skips that
        line's tail; not copied off: a second buffer of 2 MiB a call cost more than the search)."""
        now = time.monotonic()
        if now > self._listed_until:
            self._folders = [f for f in self.folder.parent.glob("w-*") if f != self.folder]
            self._listed_until = now + 5.0
        chunks: list[tuple[bytes, int]] = []
        for folder in [*self._folders, *([self.folder] if own else [])]:
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


def _keyed_lines(
    data: bytes, first: int, rank: dict[bytes, int], needles: list[tuple[bytes, int]]
) -> Iterator[tuple[int, bytes]]:
    """(rank, line) for each complete line of ``data`` from ``first`` on whose link key is in ``rank``,
    newest (last) first.

    A line begins with its link key (:data:`storage.records.LINE_START`); a line written before
    that order is searched for each of ``needles`` (:func:`storage.records.link_needle`) instead.
    """
    skip = len(LINE_START)
    end = data.rfind(b"\n", first)  # what follows the last newline is mid-write
    while end >= first:
        start = data.rfind(b"\n", first, end) + 1 or first
        if data.startswith(LINE_START, start):
            if data[start + skip] == 34:  # '"': a key, not null
                close = data.find(b'"', start + skip + 1, end)
                hit = rank.get(data[start + skip + 1 : close]) if close > 0 else None
                if hit is not None:
                    yield hit, data[start:end]
        else:
            for needle, hit in needles:
                if data.find(needle, start, end) >= 0:
                    yield hit, data[start:end]
                    break
        end = start - 1


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
