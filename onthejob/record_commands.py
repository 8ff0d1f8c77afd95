"""The record's commands behind the CLI: export, mine, retention and housekeeping (the datasets'
are onthejob/datasets.py, the serving and training ones onthejob/commands.py)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from onthejob.commands import UserError, since_flag


def export(args: argparse.Namespace) -> int:
    """``onthejob export --format sft|dpo|rl [--alias A] [--min-reward X] [--since T] -o FILE``."""
    from sqlalchemy.orm import Session

    from storage.datasets import DatasetError
    from storage.db import sync_engine
    from storage.export import export_rows, parse_since, write_jsonl

    since = since_flag(args.since, parse_since)
    if args.dataset is not None and (args.alias or since):
        raise UserError(f"--dataset {args.dataset!r} is already a selection: leave out --alias and --since")
    eng = sync_engine(args.db)
    try:
        with Session(eng) as db:
            rows, read, excluded = export_rows(
                db,
                args.project,
                args.format,
                alias=args.alias,
                since=since,
                min_reward=args.min_reward,
                dataset=args.dataset,
            )
    except DatasetError as exc:
        raise UserError(str(exc)) from exc
    finally:
        eng.dispose()
    write_jsonl(rows, Path(args.output))
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(excluded.items())) or "none"
    print(
        f"wrote {len(rows)} {args.format} rows from {read} trajectories to {args.output}; excluded: {reasons}",
        file=sys.stderr,
    )
    return 0


def mine(args: argparse.Namespace) -> int:
    """``onthejob mine [--alias A] [--since T] [--out DIR]``: flag what changed since the last pass, then report."""
    from sqlalchemy.orm import Session

    from onthejob.mine_report import write
    from storage.db import sync_engine
    from storage.export import parse_since
    from storage.mine_store import mine as mine_pass
    from storage.mine_store import report

    since = since_flag(args.since, parse_since)
    eng = sync_engine(args.db)
    try:
        with Session(eng) as db:
            try:
                done = mine_pass(db, args.project)
            except ValueError as exc:  # the project's "mine" settings
                raise UserError(str(exc)) from exc
            data = report(db, args.project, alias=args.alias, since=since)
    finally:
        eng.dispose()
    paths = write(data, Path(args.out))
    flagged = ", ".join(f"{k} {v}" for k, v in sorted(done.flagged.items())) or "nothing new"
    if done.cleared:
        flagged += f"; cleared low_grade {done.cleared} (grades revised up)"
    print(
        f"read {done.calls} new calls and {done.feedback} feedback items; flagged: {flagged}; "
        f"wrote {', '.join(str(p) for p in paths)}",
        file=sys.stderr,
    )
    return 0


def retention(args: argparse.Namespace) -> int:
    """``onthejob retention``: one pass of every project's ``retention_days``, then the change log pruned of what
    every reader has passed (the proxy runs both each period)."""
    from sqlalchemy.orm import Session

    from storage.changes import KEEP_LAST, prune_all
    from storage.db import sync_engine
    from storage.retention import apply_retention

    eng = sync_engine(args.db)
    try:
        with Session(eng) as db:
            done = apply_retention(db)
            pruned = prune_all(db, keep_last=KEEP_LAST if args.keep_changes is None else args.keep_changes)
    finally:
        eng.dispose()
    for project, counts in sorted(done.items()):
        print(
            f"project {project}: deleted {counts['calls']} calls, {counts['feedback']} feedback items, "
            f"{counts['sessions']} sessions",
            file=sys.stderr,
        )
    if not done:
        print("no project has retention_days set; nothing deleted", file=sys.stderr)
    for project, entries in sorted(pruned.items()):
        if entries:
            print(f"project {project}: pruned {entries} change-log entries every reader has passed", file=sys.stderr)
    return 0


def housekeep(args: argparse.Namespace) -> int:
    """``onthejob housekeep``: the feedback sweep, retention and change-log pruning on one schedule
    (storage/housekeep.py) until stopped, or each once with ``--once``; several copies take turns."""
    import logging

    from storage.changes import KEEP_LAST
    from storage.db import sync_engine
    from storage.housekeep import Housekeeper, Schedule

    retention = args.retention_every
    if retention is None:
        retention = float(os.environ.get("ONTHEJOB_RETENTION_EVERY", "3600"))
    prune = retention if args.prune_every is None else args.prune_every
    if min(args.sweep_every, retention, prune) < 0 or (args.keep_changes is not None and args.keep_changes < 0):
        raise UserError("--sweep-every, --retention-every, --prune-every and --keep-changes: 0 or more")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    schedule = Schedule(
        sweep_every_s=args.sweep_every,
        retention_every_s=retention,
        prune_every_s=prune,
        keep_changes=KEEP_LAST if args.keep_changes is None else args.keep_changes,
    )
    eng = sync_engine(args.db)
    keeper = Housekeeper(eng, schedule)
    try:
        if not args.once:
            stop = threading.Event()
            if args.until_stdin_closes:  # serve's copy: its parent holds the pipe; EOF when it ends, even killed
                threading.Thread(target=_stop_at_eof, args=(stop,), name="parent-watch", daemon=True).start()
            keeper.run_forever(stop)  # until SIGTERM or Ctrl-C
            return 0
        done = keeper.run_all()
    finally:
        eng.dispose()
    for name, result in done.items():
        what = "skipped: another copy holds its lock" if (name, "skipped") in keeper.runs else "failed (logged)"
        print(f"{name}: {result if result is not None else what}", file=sys.stderr)
    return 0 if all(result is not None or (name, "skipped") in keeper.runs for name, result in done.items()) else 1


def _stop_at_eof(stop: threading.Event) -> None:
    """Set ``stop`` when stdin reaches its end: the parent that holds its other end has ended."""
    while sys.stdin.buffer.read(4096):
        pass
    stop.set()
