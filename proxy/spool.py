"""The local disk spool: every record is fsync'd here before the client gets its final byte.

Group commit: the lines appended in one event-loop iteration go to one writer
thread together, which writes everything queued, fsyncs once, and wakes all the
callers of that batch.
The recorder seals the active file into a numbered segment, inserts its records
into the database, and deletes the segment only after the commit. A crash leaves
whole segments (and at worst one torn last line, which is skipped on read).

The records this process wrote are also kept in memory (up to ``MEMORY_BYTES`` of
them), so the recorder does not parse back what it has just serialised; segments
from before a restart, adopted ones and any past that budget are read from disk.
A record and its line are defined in storage/records.py.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from storage.records import LINE_START, CallRecord, link_needle

log = logging.getLogger("onthejob.spool")
ACTIVE = "active.jsonl"
MEMORY_BYTES = 64 * 1024 * 1024
SIBLING_SCAN_BYTES = 2 * 1024 * 1024


# A queued append: the line to write, the record it encodes, and the caller's future.
_Item = tuple[bytes, CallRecord, "asyncio.Future[None]"]


class SpoolFull(Exception):
    """The spool reached its size quota, or the disk is full."""


class Spool:
    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[list[_Item] | None] = queue.SimpleQueue()
        self._gathering: dict[asyncio.AbstractEventLoop, list[_Item]] = {}  # this loop iteration's appends
        self._seq = self._last_seq()
        _cut_torn_tail(folder / ACTIVE)
        self._fd = os.open(folder / ACTIVE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._active_first: float | None = None
        # Records in sealed segments and the active file, and when the oldest was written.
        self._active_records = len(read_segment(folder / ACTIVE))
        self.depth = sum(len(read_segment(p)) for p in self.segments()) + self._active_records
        self._oldest: dict[Path, float] = {p: p.stat().st_mtime for p in self.segments()}
        if self._active_records:
            self._active_first = (folder / ACTIVE).stat().st_mtime
        self.bytes = self._disk_bytes()
        # In-memory copies: per sealed segment, and for the active file (None once it holds records we lack).
        self._memory: dict[Path, tuple[list[CallRecord], int]] = {}
        self._active_memory: list[CallRecord] | None = None if self._active_records else []
        self._active_memory_bytes = 0
        self._memory_bytes = 0
        self._siblings: list[Path] = []
        self._siblings_at = 0.0
        self.appended = 0
        self.fsyncs = 0
        self._thread = threading.Thread(target=self._writer, name="spool-writer", daemon=True)
        self._thread.start()

    # ---- writing (event loop side) -------------------------------------------------
    @property
    def full(self) -> bool:
        return self.bytes >= self.max_bytes

    async def append(self, record: CallRecord) -> bytes:
        """Append one record; returns its line once it is on disk (fsync'd). Raises SpoolFull."""
        if self.full:
            raise SpoolFull(f"spool at {self.folder} holds {self.bytes} bytes, quota {self.max_bytes}")
        line = record.encode() + b"\n"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        gathering = self._gathering.get(loop)
        if gathering is None:  # the first append of this loop iteration: hand them all over after it
            gathering = self._gathering[loop] = []
            loop.call_soon(self._hand_over, loop)
        gathering.append((line, record, future))
        await future
        return line

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        """One queue put per loop iteration, not one per call: a put may wake the writer thread, which
        then takes the GIL from the loop, on the loop's own core (0.91x the CPU a call, bench/RESULTS.md)."""
        self._queue.put(self._gathering.pop(loop))

    # ---- writer thread ---------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            items = self._queue.get()
            if items is None:
                return
            batch = list(items)
            while True:  # take everything already queued: one write, one fsync
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.extend(nxt)
            error: BaseException | None = None
            data = b"".join(item[0] for item in batch)
            with self._lock:
                try:
                    size_before = os.lseek(self._fd, 0, os.SEEK_END)
                    try:
                        if os.write(self._fd, data) != len(data):  # a full disk may take part of it
                            raise OSError(errno.ENOSPC, "short write")
                        os.fsync(self._fd)
                    except OSError as exc:  # disk full: undo the partial write, refuse the batch
                        os.ftruncate(self._fd, size_before)
                        error = SpoolFull(f"spool write failed: {exc}")
                    else:
                        self.fsyncs += 1
                        self.appended += len(batch)
                        self.depth += len(batch)
                        self.bytes += len(data)
                        self._active_records += len(batch)
                        if self._active_first is None:
                            self._active_first = time.time()
                        self._remember(batch, len(data))
                except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
                    error = exc
            _wake(batch, error)

    def _remember(self, batch: list[_Item], size: int) -> None:
        """Keep the batch's records for the recorder (under the lock), within the memory budget."""
        if self._active_memory is None:
            return
        if self._memory_bytes + size > MEMORY_BYTES:
            self._memory_bytes -= self._active_memory_bytes
            self._active_memory, self._active_memory_bytes = None, 0  # this file is read back from disk
            return
        self._active_memory.extend(item[1] for item in batch)
        self._active_memory_bytes += size
        self._memory_bytes += size

    def kept(self, segment: Path) -> list[CallRecord] | None:
        """A sealed segment's records if this process wrote them all and kept them (else read the file)."""
        with self._lock:
            kept = self._memory.get(segment)
        return kept[0] if kept is not None else None

    # ---- sealing and draining (recorder side) ----------------------------------------
    def seal(self) -> Path | None:
        """Close the active file into a numbered segment (if it holds records)."""
        with self._lock:
            if self._active_records == 0:
                return None
            self._seq += 1
            target = self.folder / f"seg-{self._seq:012d}.jsonl"
            os.close(self._fd)
            os.rename(self.folder / ACTIVE, target)
            _fsync_dir(self.folder)
            self._fd = os.open(self.folder / ACTIVE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._oldest[target] = self._active_first or time.time()
            self._active_records = 0
            self._active_first = None
            if self._active_memory is not None:
                self._memory[target] = (self._active_memory, self._active_memory_bytes)
            self._active_memory, self._active_memory_bytes = [], 0
            return target

    def adopt(self, file: Path, records: int) -> None:
        """Take another folder's spooled file in as our next sealed segment."""
        with self._lock:
            self._seq += 1
            target = self.folder / f"seg-{self._seq:012d}.jsonl"
            size = file.stat().st_size
            os.rename(file, target)
            _fsync_dir(self.folder)
            self.depth += records
            self.bytes += size
            self._oldest[target] = target.stat().st_mtime

    def segments(self) -> list[Path]:
        return sorted(self.folder.glob("seg-*.jsonl"))

    def remove(self, segment: Path, records: int) -> None:
        """Delete a segment whose records are committed to the database."""
        size = segment.stat().st_size
        segment.unlink()
        with self._lock:
            self.depth -= records
            self.bytes -= size
            self._oldest.pop(segment, None)
            _, kept = self._memory.pop(segment, (None, 0))
            self._memory_bytes -= kept

    def oldest_age(self) -> float:
        """Seconds since the oldest record not yet in the database was spooled (0 when empty)."""
        times = list(self._oldest.values()) + ([self._active_first] if self._active_first else [])
        return max(0.0, time.time() - min(times)) if times else 0.0

    # ---- other workers' records (linking a follow-up served here to a turn served there) ----
    def sibling_records(self, link_keys: list[str], budget: int = SIBLING_SCAN_BYTES) -> Iterator[CallRecord]:
        """Records in other workers' spools (not yet in the database) with one of these link keys.

        Keys in priority order; for each, the newest match first. Reads at most ``budget``
        bytes, newest files first (a worker's spool holds ~50 ms of its traffic while the
        database keeps up). Nothing to do with one worker. One pass over what was read,
        whatever the number of keys: a line's link key is its first field (a long
        conversation's twenty candidate keys, each searched for through 2 MiB of long
        records, cost 2.2–2.7 ms a call: ``python -m bench.sibling_scan``).
        """
        rank = {key.encode(): i for i, key in enumerate(link_keys)}
        needles = [(link_needle(key), i) for i, key in enumerate(link_keys)]  # for lines in the older order
        found: list[tuple[int, int, int, bytes]] = []  # (key's rank, newest file first, newest line first, line)
        top = False  # the newest line of the first key is the first answer whatever else is there: given at once
        for file_no, (data, first) in enumerate(self._sibling_chunks(budget, own=False)):
            for line_no, (hit, line) in enumerate(_keyed_lines(data, first, rank, needles)):
                if hit == 0 and not top:
                    top = True
                    yield from _decoded([line])
                else:
                    found.append((hit, file_no, line_no, line))
        yield from _decoded([line for *_, line in sorted(found, key=lambda hit: hit[:3])])

    def sibling_matching(
        self, needles: list[bytes], budget: int = SIBLING_SCAN_BYTES, *, own: bool = False
    ) -> Iterator[CallRecord]:
        """Records in other workers' spools (and, with ``own``, then in this one's) whose line holds
        one of ``needles`` (in that order, newest first). ``budget`` bounds the siblings' bytes
        read, and this worker's separately: a deep backlog here never hides a sibling's record."""
        chunks = self._sibling_chunks(budget, own=own)
        for needle in needles:
            for data, first in chunks:
                for line in _lines_holding(data, needle, first):
                    try:
                        yield CallRecord.decode(line)
                    except ValueError:  # orjson.JSONDecodeError included: a torn or foreign line
                        pass

    def _sibling_chunks(self, budget: int, *, own: bool) -> list[tuple[bytes, int]]:
        """The newest ``budget`` bytes of each sibling's spool (newest file first; and this worker's with
        ``own``), each with where its first whole line starts (a read that began mid-line skips that
        line's tail; not copied off: a second buffer of 2 MiB a call cost more than the search)."""
        now = time.monotonic()
        if now > self._siblings_at:
            self._siblings = [f for f in self.folder.parent.glob("w-*") if f != self.folder]
            self._siblings_at = now + 5.0
        chunks: list[tuple[bytes, int]] = []
        for folders in (self._siblings, [self.folder] if own else []):
            left = budget
            for file in (file for folder in folders for file in _newest_first(folder)):
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

    def writable(self) -> bool:
        return not self.full and os.access(self.folder, os.W_OK)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        with self._lock:
            os.close(self._fd)

    def _last_seq(self) -> int:
        segs = self.segments()
        return int(segs[-1].stem.split("-")[1]) if segs else 0

    def _disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*.jsonl"))


def read_segment(path: Path) -> list[CallRecord]:
    """Records of a segment; a torn final line (crash mid-write, never acknowledged) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            out.append(CallRecord.decode(line))
        except orjson.JSONDecodeError:
            continue
        except ValueError as exc:  # valid JSON, not a record: nothing this proxy writes
            log.error("skipped a spool line in %s: %s", path, exc)
    return out


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


def _decoded(lines: list[bytes]) -> Iterator[CallRecord]:
    for line in lines:
        try:
            yield CallRecord.decode(line)
        except ValueError:  # orjson.JSONDecodeError included: a foreign line
            pass


def _lines_holding(data: bytes, needle: bytes, first: int = 0) -> Iterator[bytes]:
    """The complete lines of ``data`` from ``first`` on that contain ``needle``, last first (a tail may be
    mid-write)."""
    at = data.rfind(needle, first)
    while at >= 0:
        start, end = data.rfind(b"\n", first, at) + 1 or first, data.find(b"\n", at)
        if end > 0:
            yield data[start:end]
        at = data.rfind(needle, first, start)


def _newest_first(folder: Path) -> Iterator[Path]:
    """A spool folder's files, newest first. The active file is opened before the segments are
    listed: a record sealed meanwhile is then in a listed segment, and one already drained
    from there is in the database, so a reader never misses it."""
    yield folder / ACTIVE
    yield from sorted(folder.glob("seg-*.jsonl"), reverse=True)


def _cut_torn_tail(path: Path) -> None:
    """Drop a partial last line (a write cut by a crash, never acknowledged) before appending.

    Appending after it would glue the next record onto the fragment, and both would be
    unreadable; the fragment's own record was never acknowledged, so nothing is lost.
    """
    if not path.exists():
        return
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return  # the usual case: one byte read, not the whole file
        handle.seek(0)
        handle.truncate(handle.read().rfind(b"\n") + 1)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _wake(batch: list[_Item], error: BaseException | None) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for _, _, fut in batch:
        by_loop.setdefault(fut.get_loop(), []).append(fut)
    for loop, futures in by_loop.items():
        loop.call_soon_threadsafe(_resolve, futures, error)


def _resolve(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for fut in futures:
        if fut.done():
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
