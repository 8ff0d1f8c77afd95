"""The spool: durable group commit, sealing, torn-line recovery, quota."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.spool import ACTIVE, Spool, SpoolFull, read_segment
from storage.records import CallRecord
from tests.proxy.records import record


def rec(i: int, **over: object) -> CallRecord:
    return record(i, id=f"c{i}", **over)


def ids(records: list[CallRecord]) -> list[int]:
    return [int(r.id[1:]) for r in records]


def test_group_commit_seal_and_remove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path, max_bytes=10**9)
    handed: list[Any] = []

    class Counting:  # the writer thread already waits on the real queue: count the puts, pass all on
        def __init__(self, real: Any) -> None:
            self.real, self.get, self.get_nowait = real, real.get, real.get_nowait

        def put(self, items: Any) -> None:
            handed.append(items)
            self.real.put(items)

    monkeypatch.setattr(spool, "_queue", Counting(spool._queue))

    async def write() -> None:
        await asyncio.gather(*(spool.append(rec(i)) for i in range(200)))

    asyncio.run(write())
    assert spool.depth == 200 and spool.appended == 200
    # The appends of one loop iteration reach the writer thread as one item: one wake, one write, one fsync.
    assert [len(items) for items in handed] == [200] and spool.fsyncs == 1
    segment = spool.seal()
    assert segment is not None and spool.seal() is None  # nothing new to seal
    records = read_segment(segment)
    assert sorted(ids(records)) == list(range(200))
    spool.remove(segment, len(records))
    assert spool.depth == 0 and spool.bytes == 0 and spool.oldest_age() == 0
    spool.close()


def test_recovers_after_a_crash_and_skips_a_torn_line(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**9)
    asyncio.run(spool.append(rec(1)))
    spool.seal()
    asyncio.run(spool.append(rec(2)))
    spool.close()
    with (tmp_path / ACTIVE).open("ab") as handle:
        handle.write(b'{"i": 3, "tor')  # a write cut by a crash: never acknowledged
    again = Spool(tmp_path, max_bytes=10**9)
    assert again.depth == 2
    asyncio.run(again.append(rec(4)))  # must not be glued onto the torn fragment
    again.seal()
    segments = again.segments()
    assert [i for s in segments for i in ids(read_segment(s))] == [1, 2, 4]
    again.close()


def test_quota_refuses_new_records(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=64)
    asyncio.run(spool.append(rec(1)))
    assert spool.full and not spool.writable()
    with pytest.raises(SpoolFull):
        asyncio.run(spool.append(rec(2)))
    spool.close()


def test_each_worker_claims_its_own_folder_and_orphans_are_absorbed(tmp_path: Path) -> None:
    import os

    from proxy.spool_folders import absorb_orphans, claim

    first, fd1 = claim(tmp_path)
    second, fd2 = claim(tmp_path)
    assert first != second, "a folder held by a live worker is never shared"
    spool1 = Spool(first, 10**9)
    asyncio.run(spool1.append(rec(1, link_key="k1")))
    spool1.seal()
    asyncio.run(spool1.append(rec(2, link_key="k2")))
    spool1.close()
    os.close(fd1)  # worker 1 is gone; its two records are still on disk
    spool2 = Spool(second, 10**9)
    assert absorb_orphans(spool2) == 2 and not first.exists()
    assert spool2.depth == 2
    assert sorted(i for s in spool2.segments() for i in ids(read_segment(s))) == [1, 2]
    third, fd3 = claim(tmp_path)  # a sibling finds the adopted calls in the adopter's link index
    spool3 = Spool(third, 10**9)
    assert [e.id for e in spool3.sibling_links(["k2", "k1"])] == ["c2", "c1"]
    for spool, fd in ((spool2, fd2), (spool3, fd3)):
        spool.close()
        os.close(fd)


def test_records_come_from_memory_within_the_budget_and_from_disk_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import proxy.spool

    spool = Spool(tmp_path, max_bytes=10**9)
    asyncio.run(spool.append(rec(1)))
    first = spool.seal()
    assert first is not None
    assert spool.kept(first) == read_segment(first) == [rec(1)]
    spool.remove(first, 1)

    monkeypatch.setattr(proxy.spool, "MEMORY_BYTES", len(rec(2).encode()) + 10)  # room for one record, not two
    asyncio.run(spool.append(rec(2)))
    asyncio.run(spool.append(rec(3)))
    second = spool.seal()
    assert second is not None
    assert spool.kept(second) is None, "over budget: the whole file is read back"
    spool.remove(second, 2)
    assert spool._memory_bytes == 0
    spool.close()

    asyncio.run(_append_then_reopen(tmp_path))


async def _append_then_reopen(folder: Path) -> None:
    spool = Spool(folder, max_bytes=10**9)
    await spool.append(rec(4))
    spool.close()
    again = Spool(folder, max_bytes=10**9)  # a restart: the active file's records are only on disk
    await again.append(rec(5))
    segment = again.seal()
    assert segment is not None
    assert again.kept(segment) is None and ids(read_segment(segment)) == [4, 5]
    again.close()


def test_workers_split_the_spool_quota_and_see_the_same_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.main import worker_env
    from proxy.settings import Settings

    settings = Settings(
        upstreams=["http://a:1", "http://b:2"],
        spool_dir=tmp_path,
        spool_max_bytes=3_000,
        auth=False,
        database_url="postgresql://x@h/db",
    )
    env = worker_env(settings, 3)
    assert env["ONTHEJOB_SPOOL_MAX_BYTES"] == "1000"
    assert env["DATABASE_URL"] == "postgresql://x@h/db"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    again = Settings()  # what each worker process builds
    assert (again.spool_max_bytes, again.upstreams, again.auth, again.spool_dir) == (
        1000,
        ["http://a:1", "http://b:2"],
        False,
        tmp_path,
    )


def test_a_worker_finds_its_siblings_calls_in_their_link_indexes_newest_first(tmp_path: Path) -> None:
    """A sibling's link index (proxy/spool_siblings.py) lists each recorded call a follow-up may continue;
    a lookup takes keys in priority order, each key's newest entry first, and never this worker's own."""
    from proxy.spool_folders import claim
    from proxy.spool_siblings import LINKS

    mine_folder, mine_lock = claim(tmp_path)
    theirs_folder, theirs_lock = claim(tmp_path)
    mine, theirs = Spool(mine_folder, 10**9), Spool(theirs_folder, 10**9)

    async def write() -> None:
        for i, key in enumerate(["k1", "k2", "k1"]):
            await theirs.append(rec(i, link_key=key))
        await theirs.append(rec(7, link_key=None, request={"link_key": "k2"}))  # no key: not indexed
        await mine.append(record(9, id="own", link_key="k3"))

    asyncio.run(write())
    theirs.seal()  # sealing and draining leave the index alone: a drained parent is in the database
    asyncio.run(theirs.append(rec(3, link_key="k4")))
    with (theirs_folder / LINKS).open("ab") as handle:
        handle.write(b'not json\n["k5", "p"]\n')  # a foreign line and one of the wrong shape: skipped
        handle.write(b'["k6","p","ses","torn"')  # mid-write: not a line yet

    def found(*keys: str) -> list[str]:
        return [e.id for e in mine.sibling_links(list(keys))]

    assert found("k1") == ["c2", "c0"]  # newest first
    assert found("k2", "k1") == ["c1", "c2", "c0"]  # keys in priority order
    assert found("k4") == ["c3"] and found("k5") == [] and found("k6") == [] and found("k3") == []
    entry = next(mine.sibling_links(["k4"]))
    assert (entry.project_id, entry.session_id, entry.created_at) == ("p", "ses_3", rec(3, link_key="k4").created_at)
    assert list(mine.sibling_links(["k1"], budget=60)) == []  # the read is capped, newest first
    for spool in (mine, theirs):
        spool.close()
    import os

    os.close(mine_lock)
    os.close(theirs_lock)


def test_the_link_index_is_cut_back_to_its_newest_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LINKS_MAX the index keeps its newest LINKS_KEEP bytes, whole lines, and goes on appending."""
    import proxy.spool as spool_module
    from proxy.spool_folders import claim
    from proxy.spool_siblings import LINKS

    monkeypatch.setattr(spool_module, "LINKS_MAX", 4000)
    monkeypatch.setattr(spool_module, "LINKS_KEEP", 1000)
    mine_folder, mine_lock = claim(tmp_path)
    theirs_folder, theirs_lock = claim(tmp_path)
    mine, theirs = Spool(mine_folder, 10**9), Spool(theirs_folder, 10**9)

    async def write() -> None:
        for i in range(100):
            await theirs.append(rec(i, link_key=f"key-{i}"))

    asyncio.run(write())
    index = (theirs_folder / LINKS).read_bytes()
    assert len(index) <= 4000 and index.endswith(b"\n")
    assert all(line.startswith(b'["key-') for line in index.splitlines())  # whole lines only
    assert [e.id for e in mine.sibling_links(["key-99"])] == ["c99"]
    assert list(mine.sibling_links(["key-0"])) == []  # cut away
    for spool in (mine, theirs):
        spool.close()
    import os

    os.close(mine_lock)
    os.close(theirs_lock)


def test_a_short_write_is_refused_and_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills mid-batch takes part of it and returns a short count: those callers get
    SpoolFull (never an acknowledgement for a half-written line), the fragment is cut off, and the
    next append lands whole after the earlier records."""
    import proxy.spool as spool_module

    spool = Spool(tmp_path, max_bytes=10**9)
    asyncio.run(spool.append(rec(1)))
    real_write = spool_module.os.write
    monkeypatch.setattr(spool_module.os, "write", lambda fd, data: real_write(fd, data[: len(data) // 2]))
    with pytest.raises(SpoolFull, match="short write"):
        asyncio.run(spool.append(rec(2)))
    monkeypatch.setattr(spool_module.os, "write", real_write)
    asyncio.run(spool.append(rec(3)))
    assert spool.depth == 2 and spool.appended == 2
    spool.close()
    assert ids(read_segment(tmp_path / ACTIVE)) == [1, 3]
    assert (tmp_path / ACTIVE).read_bytes().count(b"\n") == 2  # no fragment of record 2 left
