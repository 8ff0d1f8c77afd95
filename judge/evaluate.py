"""``onthejob eval``: run an eval set against one version of an alias through the proxy, grade, store.

Items come from a JSONL set (``--set``: prompts or multi-turn seeds with references) or from the
project's own eval-tagged sessions (``--tag eval [--since T]``: each session's first user turn,
replayed). Each item is sent once, greedily, as ``alias@vN`` (or ``alias@base``) with an admin
key, so the proxy serves exactly that version and records the calls as ``eval`` (never trained
on). Replies are graded (judge/graders.py, or the project's judge), and the mean with its
standard error, plus every item's score (so two versions can be compared item by item), is
posted to ``POST /v1/admin/aliases/{alias}/versions/{N}/evals``, where a gate waiting for it
decides. :func:`table` and :func:`plot` show the alias's evals by version.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from judge.graders import EvalItem, GraderError, grader_for

EVAL_TAG = "eval"


@dataclass(frozen=True)
class EvalSpec:
    """What one ``onthejob eval`` does."""

    alias: str
    version: int | None  # None: the base model
    proxy: str
    key: str | None  # an admin key of the project (direct version calls are for admins)
    grader: str = "exact"
    name: str = "default"  # the eval set's name: versions are compared within one name
    set_path: Path | None = None
    tag: str | None = None  # replay this tag's sessions (with db_url)
    # "module:function": a harness that runs its own (multi-turn, tool-using) held-out episodes against
    # ``spec.model`` and returns each item's score; for families a single greedy reply cannot measure.
    episodes: str | None = None
    since: datetime | None = None
    project: str = "default"
    db_url: str | None = None
    max_tokens: int = 256
    concurrency: int = 4
    limit: int | None = None
    post: bool = True
    progress: bool = True

    @property
    def model(self) -> str:
        return f"{self.alias}@{'base' if self.version is None else f'v{self.version}'}"

    @property
    def label(self) -> str:
        return "base" if self.version is None else str(self.version)


@dataclass
class EvalResult:
    spec: EvalSpec
    scores: dict[str, float] = field(default_factory=dict)
    ungraded: dict[str, str] = field(default_factory=dict)  # item id -> why (call failed, grader said None)

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / self.n if self.n else 0.0

    @property
    def stderr(self) -> float:
        n, mean = self.n, self.mean
        if n < 2:
            return 0.0
        return math.sqrt(sum((x - mean) ** 2 for x in self.scores.values()) / (n - 1) / n)

    def payload(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "n": self.n,
            "mean": self.mean,
            "stderr": self.stderr,
            "grader": self.spec.grader,
            "source": "onthejob eval",
            "scores": self.scores,
            "detail": {"ungraded": len(self.ungraded), "model": self.spec.model},
        }


def load_set(path: Path, limit: int | None = None) -> list[EvalItem]:
    """Eval items from a JSONL file (one object a line; blank lines skipped)."""
    items = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise GraderError(f"{path}:{i} is not JSON: {exc}") from exc
            items.append(EvalItem.from_json(obj, i))
    if len({item.id for item in items}) != len(items):
        raise GraderError(f"{path}: item ids repeat; give each line a unique 'id'")
    return items[:limit] if limit else items


def replay_items(
    db_url: str, project: str, alias: str, tag: str, since: datetime | None, limit: int | None
) -> list[EvalItem]:
    """Each ``tag``-ged session's first call, cut after its first user message (no reference)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from storage.db import sync_engine
    from storage.models import Completion

    engine = sync_engine(db_url)
    try:
        with Session(engine) as db:
            query = select(Completion).where(
                Completion.project_id == project, Completion.alias == alias, Completion.endpoint == "chat"
            )
            if since is not None:
                query = query.where(Completion.created_at >= since)
            first: dict[str, Completion] = {}
            for call in db.scalars(query.order_by(Completion.created_at)):
                if tag in (call.tags or []) and call.session_id not in first:
                    first[call.session_id] = call
    finally:
        engine.dispose()
    items = []
    for session, call in first.items():
        messages = list((call.request or {}).get("messages") or [])
        cut = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
        if cut is not None:
            items.append(EvalItem(session, messages[: cut + 1], meta={"session_id": session}))
    return items[:limit] if limit else items


async def _ask(http: httpx.AsyncClient, spec: EvalSpec, item: EvalItem) -> str:
    body = {"model": spec.model, "messages": item.messages, "max_tokens": spec.max_tokens, "temperature": 0}
    headers = {"x-session-id": f"eval-{spec.name}-{spec.label}-{item.id}", "x-onthejob-tags": EVAL_TAG}
    resp = await http.post("/chat/completions", json=body, headers=headers)
    if resp.status_code != 200:
        raise GraderError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    return str(resp.json()["choices"][0]["message"].get("content") or "")


async def run_eval(spec: EvalSpec, items: Sequence[EvalItem]) -> EvalResult:
    """Ask every item (``concurrency`` at a time) and grade each reply as it comes."""
    from tqdm import tqdm

    result = EvalResult(spec)
    limit = asyncio.Semaphore(spec.concurrency)
    bar = tqdm(total=len(items), desc=f"eval {spec.model}", unit="item", disable=not spec.progress, leave=False)
    headers = {"authorization": f"Bearer {spec.key}"} if spec.key else {}
    async with contextlib.AsyncExitStack() as stack:
        judge = await _judge(spec, stack) if spec.grader == "judge" else None
        grade = None if judge is not None else grader_for(spec.grader)
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=spec.proxy.rstrip("/") + "/v1", headers=headers, timeout=300)
        )

        async def one(item: EvalItem) -> None:
            async with limit:
                try:
                    reply = await _ask(http, spec, item)
                    score = await judge(item, reply) if judge is not None else grade(item, reply)  # type: ignore[misc]
                except (GraderError, httpx.HTTPError) as exc:
                    result.ungraded[item.id] = str(exc)
                    score = None
                if score is not None:
                    result.scores[item.id] = float(score)
                elif item.id not in result.ungraded:
                    result.ungraded[item.id] = "no score"
                bar.update(1)

        await asyncio.gather(*(one(i) for i in items))
    bar.close()
    return result


async def _judge(spec: EvalSpec, stack: contextlib.AsyncExitStack) -> Any:
    """The project's judge as a grader: its rubric scores the conversation with the reply, on its scale."""
    from sqlalchemy.orm import Session

    from judge.client import JudgeClient
    from judge.main import JudgeCommand, client_for, judge_model
    from judge.parse import parse_score, to_scale
    from judge.prompts import absolute_messages
    from judge.run import project_judge
    from storage.db import sync_engine

    if spec.db_url is None:
        raise GraderError("--grader judge reads the project's judge from the database: pass --db")
    engine = sync_engine(spec.db_url)
    try:
        with Session(engine) as db:
            cfg, _ = project_judge(db, spec.project)
            model = judge_model(db, spec.project, cfg, spec.alias)
    finally:
        engine.dispose()
    command = JudgeCommand(db_url=spec.db_url, project=spec.project, proxy=spec.proxy, api_key=spec.key)
    client: JudgeClient = await stack.enter_async_context(client_for(command, cfg, model))

    async def grade(item: EvalItem, reply: str) -> float | None:
        conversation = [*item.messages, {"role": "assistant", "content": reply}]
        text = await client.complete(absolute_messages(cfg.rubric, conversation, max_chars=cfg.max_transcript_chars))
        fraction = parse_score(text)
        return None if fraction is None else to_scale(fraction, cfg.scale)

    return grade


def post(spec: EvalSpec, result: EvalResult) -> dict[str, Any]:
    """Store the result as the version's eval; the answer says what a gate decided, if anything."""
    url = f"{spec.proxy.rstrip('/')}/v1/admin/aliases/{spec.alias}/versions/{spec.label}/evals"
    headers = {"authorization": f"Bearer {spec.key}"} if spec.key else {}
    resp = httpx.post(url, json=result.payload(), headers=headers, timeout=120)
    if resp.status_code >= 400:
        raise GraderError(f"the proxy refused the eval result: HTTP {resp.status_code} {resp.text[:300]}")
    return resp.json()  # type: ignore[no-any-return]


def list_evals(proxy: str, key: str | None, alias: str, versions: Sequence[str]) -> list[dict[str, Any]]:
    """Every stored eval of these versions (``"base"`` or numbers), oldest first."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    rows: list[dict[str, Any]] = []
    for v in versions:
        resp = httpx.get(
            f"{proxy.rstrip('/')}/v1/admin/aliases/{alias}/versions/{v}/evals", headers=headers, timeout=30
        )
        if resp.status_code == 200:
            rows.extend(resp.json()["data"])
    return sorted(rows, key=lambda r: r["id"])


def table(rows: Sequence[dict[str, Any]], name: str) -> str:
    """The newest eval of each version under ``name``: version, n, mean ± s.e., grader, source."""
    newest: dict[Any, dict[str, Any]] = {}
    for row in rows:
        if row["name"] == name:
            newest[row["version"]] = row
    lines = [f"{'version':>8} {'n':>5} {'mean ± s.e.':>17}  grader / source"]
    for version, row in sorted(newest.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        label = "base" if version is None else f"v{version}"
        lines.append(
            f"{label:>8} {row['n']:>5} {row['mean']:>8.3f} ± {row['stderr']:<6.3f}  "
            f"{row['grader'] or '-'} / {row['source'] or '-'}"
        )
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], name: str, alias: str, path: Path) -> Path:
    """Mean ± standard error per version (newest eval of each) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    newest: dict[Any, dict[str, Any]] = {r["version"]: r for r in rows if r["name"] == name}
    order = sorted(newest, key=lambda v: -1 if v is None else v)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.errorbar(
        range(len(order)),
        [newest[v]["mean"] for v in order],
        yerr=[newest[v]["stderr"] for v in order],
        marker="o",
        capsize=3,
        linestyle="none",
    )
    ax.set_xticks(range(len(order)), ["base" if v is None else f"v{v}" for v in order])
    ax.set_xlabel("version")
    ax.set_ylabel(f"{name} (mean ± s.e.)")
    ax.set_title(f"{alias}: eval {name!r} by version")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def spec_from_policy(config: dict[str, Any], **fixed: Any) -> EvalSpec:
    """The EvalSpec a policy's ``eval`` setting names: ``{"set" | "tag" | "episodes", "grader", "name", "max_tokens",
    "limit", "concurrency"}``."""
    if not (config.get("set") or config.get("tag") or config.get("episodes")):
        raise GraderError(
            "the policy's eval names neither 'set' (a JSONL file), 'tag' (sessions to replay) nor 'episodes' "
            "(module:function running a harness's own episodes)"
        )
    return EvalSpec(
        grader=str(config.get("grader", "exact")),
        name=str(config.get("name", "default")),
        set_path=Path(config["set"]) if config.get("set") else None,
        tag=config.get("tag"),
        episodes=config.get("episodes"),
        max_tokens=int(config.get("max_tokens", 256)),
        limit=config.get("limit"),
        concurrency=int(config.get("concurrency", 4)),
        progress=False,
        **fixed,
    )


def evaluate(spec: EvalSpec) -> tuple[EvalResult, dict[str, Any] | None]:
    """Load the items, run them, post the result (unless ``post`` is off); (result, the proxy's answer)."""
    if spec.episodes is not None:
        result = EvalResult(spec, scores=dict(_episodes(spec.episodes)(spec)))
        if not result.scores:
            raise GraderError(f"the eval's episodes ({spec.episodes}) scored no item")
        return result, post(spec, result) if spec.post else None
    if spec.set_path is not None:
        items = load_set(spec.set_path, spec.limit)
    elif spec.tag is not None and spec.db_url is not None:
        items = replay_items(spec.db_url, spec.project, spec.alias, spec.tag, spec.since, spec.limit)
    else:
        raise GraderError("give --set FILE.jsonl, or --tag TAG with --db to replay the project's sessions")
    if not items:
        raise GraderError("the eval has no items")
    result = asyncio.run(run_eval(spec, items))
    return result, post(spec, result) if spec.post else None


def _episodes(name: str) -> Callable[[EvalSpec], Mapping[str, float]]:
    """The ``module:function`` an ``episodes`` eval names: called with the spec, returns item id -> score."""
    module, _, function = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), function) if function else None
    except (ImportError, AttributeError) as exc:
        raise GraderError(f"eval episodes {name!r}: {exc}") from exc
    if not callable(found):
        raise GraderError(f"eval episodes {name!r}: name a function as module:function")
    return found  # type: ignore[no-any-return]


def after_publish(proxy: str, key: str | None, alias: str, project: str, db_url: str | None) -> Any:
    """The trainer's hook: run the alias's configured eval (if any) on a newly published version.

    The policy's ``eval`` is one config or a list, one per task family (each its own name): each is run
    in turn, the serving version first when it has no eval of that name yet (a gate compares the two on
    every family: docs/promotion.md). Returns a function ``version -> what it did``, a line per family
    (an empty string when no eval is configured); the last line's decision is the gate's, once every
    family is in.
    """
    headers = {"authorization": f"Bearer {key}"} if key else {}

    def hook(version: int) -> str:
        policy = httpx.get(f"{proxy.rstrip('/')}/v1/admin/aliases/{alias}/policy", headers=headers, timeout=30)
        config = policy.json().get("eval") if policy.status_code == 200 else None
        if not config:
            return ""
        fixed = {"alias": alias, "proxy": proxy, "key": key, "project": project, "db_url": db_url}
        aliases = httpx.get(f"{proxy.rstrip('/')}/v1/admin/aliases", headers=headers, timeout=30).json()["data"]
        serving = next((a["deployed_version"] for a in aliases if a["name"] == alias), None)
        label = "base" if serving is None else str(serving)
        done = {r["name"] for r in list_evals(proxy, key, alias, [label])}
        lines = []
        for family in config if isinstance(config, list) else [config]:
            spec = spec_from_policy(family, version=serving, **fixed)
            if spec.name not in done:
                evaluate(spec)
            result, answer = evaluate(spec_from_policy(family, version=version, **fixed))
            decision = (answer or {}).get("decision") or "no decision yet"
            lines.append(f"eval {spec.name} {result.mean:.3f} ± {result.stderr:.3f} (n {result.n}): {decision}")
        return "\n".join(lines)

    return hook
