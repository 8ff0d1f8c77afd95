"""Promotion through the real proxy and a real engine (tiny model): gate (one task family and two), canary,
alerts, direct version calls.

Adapters are random (tests/adapters.py) and recorded as the trainer records them; the proxy is asked to
deploy them as the trainer asks (``candidate: true``). Evals and feedback are posted over REST.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from engine.launcher import Engine
from judge.evaluate import after_publish
from onthejob.cli import build_parser
from storage import verdicts
from storage.alerts import raise_alert
from storage.db import async_engine, sync_engine
from tests.adapters import light_adapter, random_adapter
from tests.proxy.conftest import Proxy, ProxyFactory, make_key
from trainer.publish import record_adapter

pytestmark = pytest.mark.engine

ALIAS = "helper"


class Admin:
    def __init__(self, proxy: Proxy, admin: str, harness: str, alias: str = ALIAS) -> None:
        self.proxy, self.admin, self.harness, self.alias = proxy, admin, harness, alias

    def req(self, method: str, path: str, body: Any = None, status: int | None = None) -> Any:
        resp = httpx.request(
            method, f"{self.proxy.v1}{path}", json=body, timeout=120, headers={"authorization": f"Bearer {self.admin}"}
        )
        assert resp.status_code == (status or resp.status_code) and resp.status_code < 500, resp.text
        return resp.json()

    def call(self, model: str, session: str, key: str | None = None) -> httpx.Response:
        return httpx.post(
            f"{self.proxy.v1}/chat/completions",
            timeout=120,
            headers={"authorization": f"Bearer {key or self.harness}", "x-session-id": session},
            json={
                "model": model,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"hello {session}"}],
            },
        )

    def served(self, resp: httpx.Response) -> dict[str, Any]:
        """The stored record of a call: which version served it, its content hash, its tags."""
        assert resp.status_code == 200, resp.text
        self.proxy.wait_drained()
        return httpx.get(
            f"{self.proxy.v1}/chat/completions/{resp.headers['x-request-id']}",
            timeout=10,  # type: ignore[no-any-return]
            headers={"authorization": f"Bearer {self.admin}"},
        ).json()["onthejob"]

    def decisions(self) -> list[tuple[int | None, str]]:
        return [
            (e["version"], e["decision"]) for e in self.req("GET", f"/admin/aliases/{self.alias}/promotions")["data"]
        ]

    def deployed(self) -> int | None:
        return next(a["deployed_version"] for a in self.req("GET", "/admin/aliases")["data"] if a["name"] == self.alias)

    def wait_for(self, decision: tuple[int, str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while decision not in self.decisions():
            assert time.monotonic() < deadline, self.decisions()
            time.sleep(0.2)


def _publish(
    db_url: str, engine: Engine, tmp_path: Path, version: int, seed: int, alias: str = ALIAS, light: float | None = None
) -> str:
    """Record a random adapter as version ``version`` (``light``: the light kind, B drawn at that scale)."""
    out = tmp_path / f"v{version}"
    path = (
        random_adapter(engine.model, out, seed=seed) if light is None else light_adapter(engine.model, out, seed, light)
    )
    eng = sync_engine(db_url)
    with Session(eng) as db:
        row = record_adapter(
            db,
            project_id="default",
            alias=alias,
            version=version,
            parent_version=None,
            path=path,
            base=engine.model,
            run_id=None,
            metrics={},
        )
        db.commit()
        sha = row.sha256
    eng.dispose()
    return sha


def _eval(a: Admin, version: str, scores: dict[str, float]) -> Any:
    n = len(scores)
    mean = sum(scores.values()) / n
    return a.req(
        "POST",
        f"/admin/aliases/{ALIAS}/versions/{version}/evals",
        status=201,
        body={"name": "heldout", "n": n, "mean": mean, "stderr": 0.1, "scores": scores},
    )


def test_gate_holds_a_worse_candidate_and_promotes_a_better_one(
    start_proxy: ProxyFactory, tiny_engine: Engine, pg_factory: Any, tmp_path: Path
) -> None:
    db_url = pg_factory()
    harness, admin = make_key(db_url, "default", "harness"), make_key(db_url, "default", "admin")
    proxy = start_proxy(
        tiny_engine.url, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0", "ONTHEJOB_PROMOTION_EVERY": "0.5"}
    )
    a = Admin(proxy, admin, harness)
    a.req("POST", "/admin/aliases", {"name": ALIAS, "base_model": tiny_engine.model.name}, status=201)
    sha1, sha2 = _publish(db_url, tiny_engine, tmp_path, 1, seed=1), _publish(db_url, tiny_engine, tmp_path, 2, seed=2)
    assert a.req("PUT", f"/admin/aliases/{ALIAS}/policy", {"mode": "gate"})["margin"] == 0.0

    # v1 is loaded, not routed: harness traffic stays on the base model.
    answer = a.req("POST", "/admin/deployments", {"alias": ALIAS, "version": 1, "candidate": True}, status=201)
    assert (answer["policy"], answer["status"]) == ("gate", "pending") and a.deployed() is None
    assert a.served(a.call(ALIAS, "s-1"))["adapter_version"] is None
    # An admin may call helper@v1 directly (tagged eval, with its content hash); a harness key may not.
    direct = a.served(a.call(f"{ALIAS}@v1", "e-1", key=admin))
    assert (direct["adapter_version"], direct["adapter_sha256"], "eval" in direct["tags"]) == (1, sha1, True)
    assert a.call(f"{ALIAS}@v1", "e-2").status_code == 404

    # Held-out results: v1 is 0.5 below the base on every item (paired): held, never routed.
    items = {f"p{i}": float(i % 3) / 2 for i in range(12)}
    assert _eval(a, "base", items)["decision"] is None  # no candidate eval yet
    assert _eval(a, "1", {k: v - 0.5 for k, v in items.items()})["decision"] == "held"
    held = a.req("GET", f"/admin/aliases/{ALIAS}/promotions")["data"][-1]
    assert held["evidence"]["eval"]["paired"] and held["evidence"]["eval"]["diff"] == pytest.approx(-0.5)
    assert a.deployed() is None and a.req("GET", f"/admin/aliases/{ALIAS}/policy")["candidate_version"] is None

    # v2 scores the same as the base: promoted, and the alias is routed to it.
    assert a.req("POST", "/admin/deployments", {"alias": ALIAS, "version": 2, "candidate": True})["status"] == "pending"
    assert _eval(a, "2", items)["decision"] == "promoted"
    assert a.deployed() == 2
    rec = a.served(a.call(ALIAS, "s-2"))
    assert (rec["adapter_version"], rec["adapter_sha256"]) == (2, sha2)

    # An open alert holds a candidate whatever its eval says.
    _publish(db_url, tiny_engine, tmp_path, 3, seed=3)
    a.req("POST", "/admin/deployments", {"alias": ALIAS, "version": 3, "candidate": True})
    asyncio.run(_alert(db_url, 3))
    a.wait_for((3, "held"))  # decided by the proxy's own loop
    assert a.deployed() == 2
    assert a.decisions() == [
        (1, "candidate"),
        (1, "held"),
        (2, "candidate"),
        (2, "promoted"),
        (3, "candidate"),
        (3, "held"),
    ]

    # Canary: half the sessions (sticky) go to v4; it earns less reward, so it is rolled back.
    v4 = _publish(db_url, tiny_engine, tmp_path, 4, seed=4)
    a.req("PUT", f"/admin/aliases/{ALIAS}/policy", {"mode": "canary", "share": 0.5, "min_sample": 4, "margin": 0.0})
    assert a.req("POST", "/admin/deployments", {"alias": ALIAS, "version": 4, "candidate": True})["status"] == "canary"
    arms: dict[str, int | None] = {}
    for i in range(16):
        first, again = a.served(a.call(ALIAS, f"c-{i}")), a.served(a.call(ALIAS, f"c-{i}"))
        assert first["adapter_version"] == again["adapter_version"]  # sticky per session
        arms[f"c-{i}"] = first["adapter_version"]
        if first["adapter_version"] == 4:
            assert first["adapter_sha256"] == v4
    assert set(arms.values()) == {2, 4}
    for session, version in arms.items():
        httpx.post(
            f"{proxy.v1}/feedback",
            headers={"authorization": f"Bearer {harness}"},
            timeout=10,
            json={
                "target": {"session_id": session},
                "name": "reward",
                "value": (0.0 if version == 4 else 1.0) + 0.01 * len(session),
            },
        ).raise_for_status()
    a.wait_for((4, "rolled_back"))
    event = a.req("GET", f"/admin/aliases/{ALIAS}/promotions")["data"][-1]
    assert event["evidence"]["live_reward"]["diff"] < -0.9
    assert {a.served(a.call(ALIAS, f"c-{i}"))["adapter_version"] for i in range(4)} == {2}
    _configured_eval(a, db_url, tiny_engine, tmp_path)


def _configured_eval(a: Admin, db_url: str, engine: Engine, tmp_path: Path) -> None:
    """The trainer's after-publish hook runs the policy's evals, one per task family (serving first, once
    each), and the gate decides once both are in; `onthejob eval` too."""
    items = tmp_path / "smoke.jsonl"
    items.write_text(
        "".join(json.dumps({"id": f"q{i}", "prompt": f"say {i}", "reference": "(?s)."}) + "\n" for i in range(3))
    )
    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"id": f"o{i}", "prompt": f"count {i}", "reference": "(?s)."}) + "\n" for i in range(2))
    )
    config = [
        {"set": str(items), "grader": "regex", "name": "smoke", "max_tokens": 4},
        {"set": str(other), "grader": "regex", "name": "other", "max_tokens": 4},
    ]
    policy = {"mode": "gate", "eval": config, "families": ["smoke", "other"]}
    a.req("PUT", f"/admin/aliases/{ALIAS}/policy", policy)
    duplicate = [config[0], {**config[1], "name": "smoke"}]
    a.req("PUT", f"/admin/aliases/{ALIAS}/policy", {"mode": "gate", "eval": duplicate}, status=400)
    _publish(db_url, engine, tmp_path, 5, seed=5)
    a.req("POST", "/admin/deployments", {"alias": ALIAS, "version": 5, "candidate": True})
    said = after_publish(a.proxy.url, a.admin, ALIAS, "default", db_url)(5).split("\n")
    # Random adapters can make the tiny model sample only special tokens (an empty reply), so the
    # scores are whatever the engine answered; the decision must be the gate's verdict on them.
    evals = {
        (v, name): [e for e in a.req("GET", f"/admin/aliases/{ALIAS}/versions/{v}/evals")["data"] if e["name"] == name]
        for v in (2, 5)
        for name in ("smoke", "other")
    }
    for name, n in (("smoke", 3), ("other", 2)):  # the serving version's once, the candidate's
        assert [(e["version"], e["n"]) for e in evals[2, name]] == [(2, n)], name
        assert [e["n"] for e in evals[5, name]] == [n], name
    stats = {
        key: verdicts.Stats.of({k: float(x) for k, x in found[0]["scores"].items()}) for key, found in evals.items()
    }
    gates = {
        name: verdicts.gate_verdict(verdicts.compare(stats[5, name], stats[2, name]), 0.0, 2.0)
        for name in ("smoke", "other")
    }
    verdict = "held" if "held" in gates.values() else "promoted"
    first = f"eval smoke {stats[5, 'smoke'].mean:.3f} ± {stats[5, 'smoke'].stderr:.3f} (n 3): no decision yet"
    last = f"eval other {stats[5, 'other'].mean:.3f} ± {stats[5, 'other'].stderr:.3f} (n 2): {verdict}"
    assert said == [first, last], said  # the gate waited for the second family
    assert a.deployed() == (5 if verdict == "promoted" else 2)
    args = build_parser().parse_args(
        [
            "eval",
            "--alias",
            ALIAS,
            "--set",
            str(items),
            "--grader",
            "exact",
            "--proxy",
            a.proxy.url,
            "--admin-key",
            a.admin,
            "--plot",
            str(tmp_path / "e.png"),
        ]
    )
    assert args.handler(args) == 0  # the serving version (v5), graded exactly: no reply is the text "(?s)."
    smoke = [e for e in a.req("GET", f"/admin/aliases/{ALIAS}/versions/5/evals")["data"] if e["name"] == "smoke"]
    assert [(e["grader"], e["mean"]) for e in smoke] == [("regex", stats[5, "smoke"].mean), ("exact", 0.0)]
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"


async def _alert(db_url: str, version: int) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    eng = async_engine(db_url)
    async with AsyncSession(eng) as db:
        await raise_alert(db, "default", ALIAS, version, "monitor", "completion_tokens", message="shorter answers")
        await db.commit()
    await eng.dispose()


FAMILIES = ("agree", "differ")
# Not "helper": the engine is the session's, and it keeps the adapters other tests loaded under the same
# names (project, alias, version), which a new database's versions would be served by.
TWO = "two-families"


def test_gate_holds_a_candidate_that_improves_one_family_and_breaks_the_other(
    start_proxy: ProxyFactory, tiny_engine: Engine, pg_factory: Any, tmp_path: Path
) -> None:
    """A gate with two task families holds the candidate that gains on one and breaks the other, naming it.

    Real: the engine and the adapters loaded into it, every reply scored (greedy, each version called
    directly as ``alias@base`` / ``alias@vN`` through the proxy), the evals posted over REST and the
    gate's decisions on them. Constructed: the two families' grading rule, since no pair of adapters
    trained to gain on one real task and lose on another fits this test on the tiny random-weight
    model: ``agree`` scores an item 1 when a version's reply equals the base model's reply to it,
    ``differ`` when it does not. So the base scores 1 and 0 by definition, v1 (a random adapter that
    changes the replies) gains on ``differ`` exactly as far as it loses on ``agree``, and v2 (an
    adapter whose B is zero: the base model's replies) equals the base on both. The tiny model's
    replies are not language (in our runs the base answered every prompt with newlines, v1 with nothing), so
    the families differ by their items' ids, not by what the items ask.
    """
    db_url = pg_factory()
    admin = make_key(db_url, "default", "admin")
    proxy = start_proxy(tiny_engine.url, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    a = Admin(proxy, admin, admin, TWO)
    a.req("POST", "/admin/aliases", {"name": TWO, "base_model": tiny_engine.model.name}, status=201)
    a.req("PUT", f"/admin/aliases/{TWO}/policy", {"mode": "gate", "families": list(FAMILIES)})
    prompts = {f"{family}{i}": f"{family} item {i}: name one colour" for family in FAMILIES for i in range(6)}
    base = _replies(a, "base", prompts)

    def post(version: str, family: str, replies: dict[str, str]) -> Any:
        scores = {k: float((r == base[k]) == (family == "agree")) for k, r in replies.items() if k.startswith(family)}
        stats = verdicts.Stats.of(scores)
        body = {"name": family, "n": stats.n, "mean": stats.mean, "stderr": stats.stderr, "scores": scores}
        return a.req("POST", f"/admin/aliases/{TWO}/versions/{version}/evals", body, status=201)

    for family in FAMILIES:
        post("base", family, base)
    _publish(db_url, tiny_engine, tmp_path, 1, seed=1, alias=TWO, light=0.5)
    _publish(db_url, tiny_engine, tmp_path, 2, seed=2, alias=TWO, light=0.0)

    # v1: its evals come one family at a time; the gate waits for both, then holds it on "agree".
    assert a.req("POST", "/admin/deployments", {"alias": TWO, "version": 1, "candidate": True})["status"] == "pending"
    v1 = _replies(a, "1", prompts)
    assert post("1", "agree", v1)["decision"] is None
    assert post("1", "differ", v1)["decision"] == "held"
    held = a.req("GET", f"/admin/aliases/{TWO}/promotions")["data"][-1]
    families = held["evidence"]["families"]
    assert families["differ"]["diff"] > 0 and families["agree"]["diff"] < 0  # better on one, worse on the other
    assert {f: families[f]["gate"] for f in FAMILIES} == {"agree": "held", "differ": "promoted"}
    assert held["reason"].startswith("worse on agree (1 of 2 families). agree: eval "), held["reason"]
    assert held["evidence"]["eval"]["name"] == "agree" and a.deployed() is None

    # v2 answers as the base does: no family is worse, so it is promoted and routed.
    assert a.req("POST", "/admin/deployments", {"alias": TWO, "version": 2, "candidate": True})["status"] == "pending"
    v2 = _replies(a, "2", prompts)
    assert post("2", "agree", v2)["decision"] is None
    assert post("2", "differ", v2)["decision"] == "promoted"
    promoted = a.req("GET", f"/admin/aliases/{TWO}/promotions")["data"][-1]
    assert promoted["reason"].startswith("no family worse (2 families)"), promoted["reason"]
    assert a.deployed() == 2
    assert a.decisions() == [(1, "candidate"), (1, "held"), (2, "candidate"), (2, "promoted")]


def _replies(a: Admin, version: str, prompts: dict[str, str]) -> dict[str, str]:
    """Each prompt's greedy reply from ``two-families@base`` or ``@v{version}``, called directly (admin key)."""
    out = {}
    for item, prompt in prompts.items():
        resp = httpx.post(
            f"{a.proxy.v1}/chat/completions",
            timeout=120,
            headers={"authorization": f"Bearer {a.admin}", "x-session-id": f"{version}-{item}"},
            json={
                "model": f"{TWO}@{version if version == 'base' else f'v{version}'}",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        assert resp.status_code == 200, resp.text
        out[item] = resp.json()["choices"][0]["message"]["content"] or ""
    return out
