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

Beside the records, each spool folder keeps its *link index* (``links.idx``, proxy/spool_siblings.py):
one short line per recorded call that a follow-up may continue (its link key, session and id), written
after the record's fsync and before its caller is woken. Sibling workers look a parent up there, reading
a few hundred bytes a call whatever the calls' size, instead of scanning the records themselves.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from proxy.spool_siblings import LINK_SCAN_BYTES, LINKS, SIBLING_SCAN_BYTES, LinkEntry, Siblings, link_line
from storage.records import CallRecord

log = logging.getLogger("onthejob.spool")
ACTIVE = "active.jsonl"
MEMORY_BYTES = 64 * 1024 * 1024
# The link index is cut back to its newest LINKS_KEEP bytes once it passes LINKS_MAX: readers read its
# newest LINK_SCAN_BYTES (64 KiB), and an entry older than that is a parent long drained to the database.
LINKS_MAX = 4 * 1024 * 1024
LINKS_KEEP = 256 * 1024


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
        self._links_fd = os.open(folder / LINKS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._links_bytes = os.fstat(self._links_fd).st_size
        self._links_failing = False
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
        self.siblings = Siblings(folder, _newest_first)
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
                        self._index(item[1] for item in batch)
                except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
                    error = exc
            _wake(batch, error)

    def index(self, records: list[CallRecord]) -> None:
        """Add link index lines for records this worker took over (:meth:`adopt`)."""
        with self._lock:
            self._index(records)

    def _index(self, records: Iterable[CallRecord]) -> None:
        """Append the batch's link index lines (under the lock, after the records' fsync, before the callers
        are woken: a follow-up sent after the reply finds its parent there). Not fsync'd: the index is a
        hint, a crash loses at most its last lines, and those calls' records drain to the database. A write
        that fails is logged once and skipped; the records stand."""
        data = b"".join(link_line(record) for record in records)
        if not data:
            return
        try:
            os.write(self._links_fd, data)
            self._links_bytes += len(data)
            if self._links_bytes > LINKS_MAX:
                self._cut_links()
            self._links_failing = False
        except OSError as exc:
            if not self._links_failing:
                log.warning("link index not written (%s): siblings find these calls in the database", exc)
            self._links_failing = True

    def _cut_links(self) -> None:
        """Keep the index's newest :data:`LINKS_KEEP` bytes (whole lines): a new file renamed over it, so a
        sibling reading the old one meanwhile reads it whole."""
        path = self.folder / LINKS
        with path.open("rb") as handle:
            handle.seek(max(0, self._links_bytes - LINKS_KEEP))
            tail = handle.read()
        tail = tail[tail.find(b"\n") + 1 :]
        tmp = self.folder / (LINKS + ".tmp")
        tmp.write_bytes(tail)
        os.replace(tmp, path)
        os.close(self._links_fd)
        self._links_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._links_bytes = len(tail)

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
    def sibling_links(self, link_keys: list[str], budget: int = LINK_SCAN_BYTES) -> Iterator[LinkEntry]:
        """:meth:`proxy.spool_siblings.Siblings.links`: sibling workers' link index entries with these keys."""
        return self.siblings.links(link_keys, budget)

    def sibling_matching(
        self, needles: list[bytes], budget: int = SIBLING_SCAN_BYTES, *, own: bool = False
    ) -> Iterator[CallRecord]:
        """:meth:`proxy.spool_siblings.Siblings.matching`: sibling workers' records holding these bytes."""
        return self.siblings.matching(needles, budget, own=own)

    def writable(self) -> bool:
        return not self.full and os.access(self.folder, os.W_OK)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        with self._lock:
            os.close(self._fd)
            os.close(self._links_fd)

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
