"""Reading and deleting calls stored in the delta form (storage/stored_form.py says what it is).

Every reader gets rows in full: ORM ``Completion`` rows through the load event :func:`on_load`
(installed by storage/models/record.py), column reads through :func:`expand_requests`. A row's chain
back to the row that begins it is one recursive query for any number of calls (:class:`Rows`), plus
one for the shared prefixes; rows of one ORM query share what was expanded.

Deleting: :func:`release_prefixes` takes doomed calls' references off their project's shared
prefixes; :func:`rewrite_children_in_full` rewrites every kept call stored as a delta of a doomed one
(retention, and a session delete should a chain ever cross sessions).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from storage.records import dump_json
from storage.stored_form import _PREFIX_REF, DELTA_HEAD, MARK, Pair, expand_one, is_delta

Fetch = Callable[[list[str]], dict[str, Pair]]  # ids → those rows and their chains' rows, as stored
FetchPrefixes = Callable[[list[str]], dict[str, Any]]  # hashes → bodies


def expand_with(
    stored: dict[str, Pair], fetch: Fetch, prefixes: FetchPrefixes, full: dict[str, Pair] | None = None
) -> dict[str, Pair]:
    """Every row of ``stored`` (id → stored (request, ids)) in full. ``full``: rows already in full
    (updated with every row expanded here); ``fetch`` reads rows with their chains, ``prefixes`` bodies."""
    full = {} if full is None else full
    known = dict(stored)
    todo = {_parent(r) for r, _ in known.values() if is_delta(r)} - {None} - known.keys() - full.keys()
    while todo:  # once: the query follows every chain (a row written by another serialiser: again)
        got = fetch(sorted(t for t in todo if t is not None))
        missing = todo - got.keys()
        if missing:
            raise LookupError(f"stored form: parent rows {sorted(str(m) for m in missing)[:3]} are gone")
        known.update(got)
        todo = {_parent(r) for r, _ in got.values() if is_delta(r)} - {None} - known.keys() - full.keys()
    wanted = {r[MARK]["prefix"] for r, _ in known.values() if is_delta(r) and r[MARK].get("prefix")}
    bodies = prefixes(sorted(wanted)) if wanted else {}
    if wanted - bodies.keys():
        raise LookupError(f"stored form: shared prefixes {sorted(wanted - bodies.keys())[:3]} are gone")

    def resolve(call_id: str) -> Pair:
        chain = []
        while call_id not in full and is_delta(known[call_id][0]) and _parent(known[call_id][0]) is not None:
            chain.append(call_id)
            call_id = _parent(known[call_id][0])  # type: ignore[assignment]
        if call_id not in full:
            row = known[call_id]
            full[call_id] = expand_one(row, (bodies[row[0][MARK]["prefix"]], None)) if is_delta(row[0]) else row
        for child in reversed(chain):
            full[child] = expand_one(known[child], full[call_id])
            call_id = child
        return full[call_id]

    return {i: resolve(i) for i in stored}


def _parent(request: dict[str, Any]) -> str | None:
    parent: str | None = request[MARK].get("parent")
    return parent


CHAIN_SQL = f"""WITH RECURSIVE chain(id, parent_id, delta) AS (
  SELECT id, parent_id, substr(CAST(request AS TEXT), 1, {len(DELTA_HEAD)}) = '{DELTA_HEAD}'
    FROM completions WHERE id IN :ids
  UNION
  SELECT c.id, c.parent_id, substr(CAST(c.request AS TEXT), 1, {len(DELTA_HEAD)}) = '{DELTA_HEAD}'
    FROM completions c JOIN chain ON c.id = chain.parent_id WHERE chain.delta
)
SELECT id, request, prompt_token_ids FROM completions WHERE id IN (SELECT id FROM chain)"""


class Rows:
    """Reading stored rows through a SQLAlchemy connection (Core: no ORM events, no autoflush), Postgres or
    SQLite: a row's chain back to the row that begins it in one recursive query. What it expanded, and the
    prefixes it read, it keeps (one per ORM query, or per call of :func:`expand_requests`)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.full: dict[str, Pair] = {}
        self.bodies: dict[str, Any] = {}

    def fetch(self, ids: list[str]) -> dict[str, Pair]:
        from sqlalchemy import bindparam, text

        from storage.models import Completion

        json_type = Completion.__table__.c.request.type
        stmt = (
            text(CHAIN_SQL)
            .bindparams(bindparam("ids", expanding=True))
            .columns(id=Completion.__table__.c.id.type, request=json_type, prompt_token_ids=json_type)
        )
        return {row[0]: (row[1], row[2]) for row in self.conn.execute(stmt, {"ids": ids})}

    def prefixes(self, hashes: list[str]) -> dict[str, Any]:
        from sqlalchemy import select

        from storage.models import StoredPrefix

        todo = [h for h in hashes if h not in self.bodies]
        if todo:
            p = StoredPrefix.__table__.c
            # One hash is one text in every project: any copy reads the same.
            for digest, body in self.conn.execute(select(p.hash, p.body).where(p.hash.in_(todo))):
                self.bodies[digest] = body
        return {h: self.bodies[h] for h in hashes if h in self.bodies}

    def expand(self, stored: dict[str, Pair]) -> dict[str, Pair]:
        return expand_with(stored, self.fetch, self.prefixes, self.full)


_CACHE = "onthejob.stored_form.full"


def on_load(target: Any, context: Any, attrs: Any = None) -> None:
    """The ORM's load (and refresh) event of ``Completion``: a delta row arrives in full, as loaded
    (never written back). Runs inside the session's connection, async sessions included. Rows of one
    query share what was expanded: the parent of a row loaded after it costs no query."""
    state = target.__dict__
    request = state.get("request")
    if not is_delta(request):
        return
    from sqlalchemy.orm.attributes import set_committed_value

    shared = getattr(context, "attributes", None)
    conn = context.session.connection()
    rows = shared.get(_CACHE) if isinstance(shared, dict) else None
    if rows is None or rows.conn is not conn:
        rows = Rows(conn)
        if isinstance(shared, dict):
            shared[_CACHE] = rows
    pair = rows.expand({target.id: (request, state.get("prompt_token_ids"))})[target.id]
    set_committed_value(target, "request", pair[0])
    set_committed_value(target, "prompt_token_ids", pair[1])


def expand_requests(conn: Any, rows: dict[str, Any]) -> dict[str, Any]:
    """Column reads (id → stored request) in full: the requests only (storage/mine_store.py)."""
    deltas = {i: (r, None) for i, r in rows.items() if is_delta(r)}
    if not deltas:
        return rows
    full = Rows(conn).expand(deltas)
    return {i: full[i][0] if i in full else r for i, r in rows.items()}


def full_columns_sync(conn: Any, call_id: str) -> dict[str, str]:
    """One call's ``request`` and ``prompt_token_ids`` JSON text in full, through a psycopg connection
    (bench/long_sessions.py sizes today's form of a row with it)."""
    sql = CHAIN_SQL.replace("IN :ids", "= ANY(%(ids)s)").replace("%", "%%").replace("%%(ids)s", "%(ids)s")

    def fetch(ids: list[str]) -> dict[str, Pair]:
        return {r[0]: (r[1], r[2]) for r in conn.execute(sql, {"ids": ids}).fetchall()}

    def prefixes(hashes: list[str]) -> dict[str, Any]:
        rows = conn.execute("SELECT hash, body FROM stored_prefixes WHERE hash = ANY(%s)", (hashes,)).fetchall()
        return {r[0]: r[1] for r in rows}

    first = fetch([call_id])
    request, ids = expand_with(
        {call_id: first[call_id]}, lambda i: first if set(i) <= first.keys() else fetch(i), prefixes
    )[call_id]
    return {"request": dump_json(request).decode(), "prompt_token_ids": dump_json(ids).decode()}


def release_prefixes(db: Any, project: str, calls: Sequence[str]) -> int:
    """Before ``calls`` are deleted (storage/deletion.py, storage/retention.py): take their references off the
    project's shared prefixes, and delete those no row references any more. How many references went."""
    from sqlalchemy import String, cast, delete, func, select, update

    from storage.models import Completion, StoredPrefix

    if not calls:
        return 0
    t = Completion.__table__.c
    head = select(func.substr(cast(t.request, String), 1, 160))
    rows = db.execute(head.where(t.project_id == project, t.id.in_(list(calls)))).scalars()
    counts = Counter(
        m.group(1).decode()
        for text in rows
        if text and text.startswith('{"' + MARK)
        if (m := _PREFIX_REF.search(text.encode())) is not None
    )
    p = StoredPrefix.__table__.c
    for digest, n in counts.items():
        db.execute(update(StoredPrefix).where(p.project_id == project, p.hash == digest).values(refs=p.refs - n))
    if counts:
        db.execute(delete(StoredPrefix).where(p.project_id == project, p.hash.in_(list(counts)), p.refs <= 0))
    return sum(counts.values())


def rewrite_children_in_full(db: Any, project: str, doomed: list[str]) -> int:
    """Before ``doomed`` calls are deleted (retention, storage/retention.py): every kept call stored as
    a delta of one of them is rewritten in full, so no chain loses a link. A kept call further down
    only references kept calls, so the direct children are all. How many were rewritten."""
    from sqlalchemy import select, update

    from storage.models import Completion

    t = Completion.__table__.c
    conn = db.connection()
    rows = conn.execute(
        select(t.id, t.request, t.prompt_token_ids).where(
            t.project_id == project, t.parent_id.in_(doomed), t.id.not_in(doomed)
        )
    ).all()
    deltas = {r[0]: (r[1], r[2]) for r in rows if is_delta(r[1]) and _parent(r[1]) is not None}
    if not deltas:
        return 0
    for call_id, (request, ids) in Rows(conn).expand(deltas).items():
        conn.execute(update(Completion).where(Completion.id == call_id).values(request=request, prompt_token_ids=ids))
    return len(deltas)
