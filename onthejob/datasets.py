"""``onthejob dataset create | list | show | diff``: the admin routes' answers, read straight from the database."""

from __future__ import annotations

import argparse
import json
from typing import Any

from onthejob.commands import UserError

SHOWN = 20  # items printed by `show` and per side by `diff` (--json prints all)


def spec_from_args(args: argparse.Namespace) -> Any:
    """``--filter KEY=VALUE`` (repeated), ``--from-mine``, ``--curated``, ``--per-task`` as a :class:`Spec`."""
    from storage.datasets import DatasetError, DatasetFilter, Spec

    raw: dict[str, Any] = {}
    for item in args.filter:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--filter {item!r}: write KEY=VALUE, e.g. --filter alias=helper")
        raw[key.strip()] = value.strip()
    try:
        return Spec(
            DatasetFilter.from_dict(raw), from_mine=args.from_mine, curated=args.curated, per_task=args.per_task
        )
    except DatasetError as exc:
        raise UserError(str(exc)) from exc


def _counts(d: dict[str, Any]) -> str:
    c = d["counts"]
    roles = ", ".join(f"{k} {v}" for k, v in c.get("roles", {}).items())
    removed = f", {d['removed']} removed since (deleted sessions)" if d.get("removed") else ""
    return (
        f"{c.get('trajectories', 0)} trajectories ({roles + ', ' if roles else ''}{c.get('graded', 0)} graded, "
        f"{c.get('sessions', 0)} sessions, {c.get('feedback', 0)} feedback items){removed}"
    )


def _item(i: dict[str, Any]) -> str:
    reward = "ungraded" if i["reward"] is None else f"reward {i['reward']:g}"
    role = f"[{i['role']}] " if i["role"] != "item" else ""
    return f"  {role}{i['trajectory_id']}  session {i['session_id']}  task {i['task_id']}  {reward}"


def _text(action: str, out: dict[str, Any]) -> str:
    if action == "list":
        return (
            "\n".join(f"{d['name']}  {d['created_at']}  {d['filter']['kind']}  {_counts(d)}" for d in out["data"])
            or "no datasets"
        )
    if action == "diff":
        lines = [
            f"only in {out['a']}: {len(out['only_a'])}, only in {out['b']}: {len(out['only_b'])}, "
            f"changed: {len(out['changed'])}, same: {out['same']}"
        ]
        for label, key in ((f"only in {out['a']}", "only_a"), (f"only in {out['b']}", "only_b")):
            lines += [f"{label}:", *(_item(i) for i in out[key][:SHOWN])] if out[key] else []
        for c in out["changed"][:SHOWN]:
            lines.append(f"  changed {c['trajectory_id']}: reward {c['a']['reward']} -> {c['b']['reward']}")
        return "\n".join(lines)
    lines = [
        f"{out['name']} ({out['filter']['kind']}, created {out['created_at']}): {_counts(out)}",
        f"filter: {json.dumps(out['filter'])}",
    ]
    lines += [_item(i) for i in out.get("items", [])[:SHOWN]]
    if len(out.get("items", [])) > SHOWN:
        lines.append(f"  ... {len(out['items']) - SHOWN} more (--json prints all)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.orm import Session

    from storage import datasets
    from storage.db import sync_engine

    action = args.dataset_command
    eng = sync_engine(args.db)
    try:
        with Session(eng) as db:
            if action == "create":
                out = datasets.create(db, args.project, args.name, spec_from_args(args), args.description)
                db.commit()
            elif action == "list":
                out = {"object": "list", "data": datasets.list_datasets(db, args.project)}
            elif action == "show":
                out = datasets.show(db, args.project, args.name)
            else:
                out = datasets.diff(db, args.project, args.a, args.b)
    except datasets.DatasetError as exc:
        raise UserError(str(exc)) from exc
    finally:
        eng.dispose()
    if action == "create" or not args.json:
        print(f"created {_text('show', out)}" if action == "create" else _text(action, out))
    else:
        print(json.dumps(out, indent=1, default=str))
    return 0
