"""Which spool folder each worker process owns, and taking in the folders of workers that are gone.

One folder per worker (``w-…`` under the spool root), held with an exclusive ``flock`` for the
worker's lifetime, so no two processes ever append to one file; :mod:`proxy.spool` writes inside it.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path

from proxy.spool import ACTIVE, Spool, read_segment
from proxy.spool_siblings import LINKS


def claim(root: Path) -> tuple[Path, int]:
    """A spool folder under ``root`` that only this process writes (one per worker).

    Each worker holds an exclusive ``flock`` on its folder for its lifetime. A new
    worker first adopts a folder whose owner died (its records drain from there),
    else makes a new one. Returns the folder and the lock's file descriptor.
    """
    root.mkdir(parents=True, exist_ok=True)
    for folder in sorted(root.glob("w-*")):
        fd = _try_lock(folder)
        if fd is not None:
            return folder, fd
    folder = root / f"w-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    fd = _try_lock(folder)
    assert fd is not None
    return folder, fd


def absorb_orphans(spool: Spool) -> int:
    """Move the records of sibling folders nobody holds (more workers before a restart) into ours."""
    moved = 0
    for folder in sorted(spool.folder.parent.glob("w-*")):
        if folder == spool.folder:
            continue
        fd = _try_lock(folder)
        if fd is None:
            continue  # a live worker owns it
        try:
            files = sorted(folder.glob("seg-*.jsonl")) + [folder / ACTIVE]
            for file in files:
                records = read_segment(file)
                if records:
                    spool.adopt(file, len(records))
                    spool.index(records)  # siblings look their parents up in our link index now
                    moved += len(records)
                else:
                    file.unlink(missing_ok=True)
            for leftover in (LINKS, LINKS + ".tmp", ".lock"):  # its link index: those calls are ours now
                (folder / leftover).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            pass  # something else is in there; leave it
        finally:
            os.close(fd)
    return moved


def _try_lock(folder: Path) -> int | None:
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
