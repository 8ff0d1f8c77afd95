"""What a worker pays to look for a call's parent in its sibling workers' spools (``serve --workers N``).

An unnamed call whose parent this worker did not serve looks in the other workers'
link indexes (``Spool.sibling_links``: 64 KiB of each, one short line a call) before the
database; before the index it scanned their spools (``Spool.sibling_records``: up to
2 MiB of records each, newest first), for every candidate key (each prefix of the
conversation ending with an assistant turn). This fills a sibling's spool with records of ``--record-kb`` each
(a long conversation's calls), then times the lookup with 1, 5 and 20 candidate keys,
for a parent that is not there (already drained to the database: the usual case once a
turn is older than ~50 ms) and for one that is (the newest record).

``--checkout PATH`` also runs the same lookups with another checkout's ``proxy.spool``
(a ``git worktree`` of another commit) in a subprocess, and prints both side by side.

Run: ``.venv/bin/python -m bench.sibling_scan [--record-kb 30] [--checkout PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(record_kb: int, repeats: int) -> dict[str, float]:
    """Milliseconds a lookup, by case, with whatever ``proxy.spool`` is first on the path."""
    from proxy.spool import Spool
    from proxy.spool_folders import claim
    from tests.proxy.records import record

    with tempfile.TemporaryDirectory() as tmp:
        (mine_folder, mine_lock), (theirs_folder, theirs_lock) = claim(Path(tmp)), claim(Path(tmp))
        mine, theirs = Spool(mine_folder, 10**10), Spool(theirs_folder, 10**10)
        text = "observation text " * (record_kb * 1024 // 17)
        keys = [os.urandom(32).hex() for _ in range(90)]

        async def fill() -> None:  # 2.6 MiB at 30 KiB a record: past the lookup's 2 MiB budget
            for i, key in enumerate(keys):
                await theirs.append(record(i, link_key=key, request={"messages": [{"role": "user", "content": text}]}))

        asyncio.run(fill())
        # The link index (sibling_links) where this checkout has one; before it, the scan of the records.
        lookup = getattr(mine, "sibling_links", None) or mine.sibling_records
        out: dict[str, float] = {}
        for candidates in (1, 5, 20):
            absent = [os.urandom(32).hex() for _ in range(candidates)]
            for case, wanted in (("absent", absent), ("newest", [*absent[1:], keys[-1]])):
                start = time.perf_counter()
                for _ in range(repeats):
                    next(iter(lookup(wanted[::-1])), None)
                out[f"{case} {candidates}"] = (time.perf_counter() - start) / repeats * 1000
        for spool in (mine, theirs):
            spool.close()
        os.close(mine_lock)
        os.close(theirs_lock)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-kb", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--checkout", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a checkout's subprocess
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.record_kb, args.repeats)))
        return
    here = measure(args.record_kb, args.repeats)
    there = None
    if args.checkout:
        run = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--json",
                "--record-kb",
                str(args.record_kb),
                "--repeats",
                str(args.repeats),
            ],
            env={**os.environ, "PYTHONPATH": str(args.checkout.resolve())},
            cwd=args.checkout,
            capture_output=True,
            text=True,
            check=True,
        )
        there = json.loads(run.stdout.splitlines()[-1])
    print(f"sibling lookup, one sibling spool of {args.record_kb} KiB records (2 MiB read), ms a lookup:")
    print("| parent | candidate keys | this checkout |" + (" other checkout | ratio |" if there else ""))
    print("|---|---:|---:|" + ("---:|---:|" if there else ""))
    for name, ms in here.items():
        case, candidates = name.split()
        row = f"| {case} | {candidates} | {ms:.3f} |"
        if there:
            row += f" {there[name]:.3f} | {ms / there[name]:.2f}x |"
        print(row)


if __name__ == "__main__":
    main()
