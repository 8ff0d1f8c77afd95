"""A soak of the whole proxy: minutes of concurrent sessions while everything that goes wrong goes wrong.

Two stub engines (bench/stub_upstream.py), ``onthejob serve`` as a subprocess on a private Postgres
cluster (tests/pg_cluster.py: its own folder and port; the machine's shared Postgres is never touched),
attestation every 2 s. For ``--minutes`` (fixed ``--seed``):

* ``--clients`` clients call ``agent`` (an alias of the stub's model) and the base model, streamed
  and not, as ``x-session-id: customer-<k>`` (24 ids, reused all the time, also after their delete;
  even k carry end user ``user-<k>``), and grade a share of the calls (thumbs feedback);
* a deleter deletes sessions mid-flight (``DELETE /v1/admin/sessions/{id}``), and now and then an
  end user (``DELETE /v1/admin/end-users/{id}``);
* a trainer assembles batches as ``train --watch`` does (trainer/runner.py ``_next_batch``: the
  incremental feed, holding a backlog, then ``storage.deletion.live``), every second;
* four times (twice in a run under a minute), two trainers publish to ``agent`` at once
  (trainer/publish.py, light adapters written with numpy; both saves in flight together) and both
  versions are deployed at once;
* one engine hangs in ``load_lora_adapter`` from 30 % to 80 % of the run (the stub's ``/stub/hang-loads``),
  across two of those deployments;
* the database is stopped at half time and started again (up to 15 s later);
* probes with bad input and reads (also while the database is down) look at every error answer.

At the end (spool drained, a last batch assembled from the beginning of the change log) it checks
the invariants in bench/soak_log.py, prints a JSON line and a table, and exits 1 if one failed.

Run: ``.venv/bin/python -m bench.soak [--minutes 5] [--seed 0] [--clients 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import PY, machine_description, wait_spool_empty
from bench.reliability import rows_of, run_within, start_proc, start_proxy
from bench.soak_log import Call, Log, check, user_of
from bench.soak_probes import probe_once, send, stream
from bench.soak_train import LIGHT_CONFIG, train_and_deploy, watch
from tests.pg_cluster import PgCluster

PROJECT, ALIAS, BASE_MODEL = "default", "agent", "stub-model"
SESSIONS = 24


@dataclass
class Soak:
    args: argparse.Namespace
    proxy: str
    stubs: list[str]
    cluster: PgCluster
    work: Path
    log: Log = field(default_factory=Log)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    halt: threading.Event = field(default_factory=threading.Event)  # the trainer thread's stop
    t0: float = field(default_factory=time.time)

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.args.seed}:{name}")

    def mark(self, name: str) -> None:
        self.log.marks[name] = time.time()
        print(f"  t={time.time() - self.t0:6.1f} s  {name}", flush=True)

    async def at(self, fraction: float) -> None:
        await asyncio.sleep(max(0.0, self.t0 + fraction * self.args.minutes * 60 - time.time()))


async def client(soak: Soak, http: httpx.AsyncClient, i: int) -> None:
    rng, n = soak.rng(f"client{i}"), 0
    while not soak.stop.is_set():
        session = f"customer-{rng.randrange(SESSIONS)}"
        user, streamed, n = user_of(session), rng.random() < 0.5, n + 1
        text = f"{session} client {i} turn {n}"
        body: dict[str, Any] = {
            "model": ALIAS if rng.random() < 0.8 else BASE_MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": text}],
        }
        if user is not None:
            body["user"] = user
        headers = {"x-session-id": session}
        call = Call("chat", session, user, time.time())
        if streamed:
            await stream(
                http, call, f"{soak.proxy}/v1/chat/completions", {**body, "stream": True, "stub_gap_ms": 2}, headers
            )
        else:
            await send(http, call, "POST", f"{soak.proxy}/v1/chat/completions", json=body, headers=headers)
        soak.log.calls.append(call)
        if call.status == 0:
            await asyncio.sleep(0.05)
        if call.complete and call.rid and rng.random() < 0.4:
            fb = Call("feedback", session, user, time.time())
            grade = {"target": {"completion_id": call.rid}, "name": "thumbs", "value": rng.random() < 0.5}
            await send(http, fb, "POST", f"{soak.proxy}/v1/feedback", json=grade)
            fb.complete = False  # feedback is no call to be recorded as one
            soak.log.calls.append(fb)


async def deleter(soak: Soak, http: httpx.AsyncClient) -> None:
    rng = soak.rng("deleter")
    while not soak.stop.is_set():
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        k = rng.randrange(SESSIONS)
        session, user = f"customer-{k}", user_of(f"customer-{k}")
        if user is not None and rng.random() < 0.3:
            d = Call("delete_end_user", None, user, time.time())
            await send(http, d, "DELETE", f"{soak.proxy}/v1/admin/end-users/{user}")
        else:
            d = Call("delete_session", session, None, time.time())
            await send(http, d, "DELETE", f"{soak.proxy}/v1/admin/sessions/{session}")
        soak.log.deletes.append(d)


async def prober(soak: Soak, http: httpx.AsyncClient) -> None:
    rng = soak.rng("prober")
    while not soak.stop.is_set():
        down = "database stopped" in soak.log.marks and "database started" not in soak.log.marks
        await asyncio.sleep(0.2 if down else 1.0)
        soak.log.calls.append(await probe_once(http, soak.proxy, rng, soak.log.calls))


async def monitor(soak: Soak, http: httpx.AsyncClient) -> None:
    """Which models each stub lists, every half second: a replica that lists one may serve it."""
    while not soak.stop.is_set():
        for url in soak.stubs:
            try:
                data = (await http.get(f"{url}/v1/models", timeout=2)).json()["data"]
                soak.log.health.append((time.time(), url, frozenset(str(m["id"]) for m in data)))
            except (httpx.HTTPError, ValueError, KeyError):
                soak.log.health.append((time.time(), url, frozenset()))
        await asyncio.sleep(0.5)


async def hang(soak: Soak, http: httpx.AsyncClient, on: bool) -> None:
    await http.post(f"{soak.stubs[1]}/stub/hang-loads", json={"hang": on})
    soak.mark(f"engine 2 {'hangs' if on else 'no longer hangs'} in load_lora_adapter")


async def timeline(soak: Soak, http: httpx.AsyncClient) -> None:
    outage = min(15.0, max(3.0, 0.08 * soak.args.minutes * 60))
    await soak.at(0.12)
    await train_and_deploy(soak, http, 1)
    await soak.at(0.30)
    await hang(soak, http, True)
    await soak.at(0.33)
    await train_and_deploy(soak, http, 2)
    await soak.at(0.50)
    await asyncio.to_thread(soak.cluster.stop)
    soak.mark("database stopped")
    await asyncio.sleep(outage)
    await asyncio.to_thread(soak.cluster.start)
    soak.mark("database started")
    rounds = soak.args.minutes >= 1  # a short run (the CI's smoke) publishes twice, not four times
    if rounds:
        await soak.at(0.68)
        await train_and_deploy(soak, http, 3)
    await soak.at(0.80)
    await hang(soak, http, False)
    if rounds:
        await soak.at(0.85)
        await train_and_deploy(soak, http, 4)
    await soak.at(1.0)


async def scenario(soak: Soak) -> None:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        made = await http.post(f"{soak.proxy}/v1/admin/aliases", json={"name": ALIAS, "base_model": BASE_MODEL})
        assert made.status_code == 201, made.text
        (soak.work / "config.json").write_text(json.dumps(LIGHT_CONFIG))
        trainer = asyncio.create_task(asyncio.to_thread(watch, soak))
        clients = [client(soak, http, i) for i in range(soak.args.clients)]
        actors = [
            asyncio.create_task(a) for a in (deleter(soak, http), prober(soak, http), monitor(soak, http), *clients)
        ]
        soak.mark("load started")
        await timeline(soak, http)
        soak.stop.set()
        await asyncio.gather(*actors)
        soak.mark("load stopped")
        await asyncio.to_thread(wait_spool_empty, soak.proxy, 300)
        soak.mark("spool empty")
        await asyncio.sleep(2.0)  # the recorder's last batch commits
        soak.halt.set()
        await trainer
        soak.mark("last batch assembled")
        for url in soak.stubs:  # the proxy's attestation probes are its only /v1/completions calls
            stats = (await http.get(f"{url}/stub/stats")).json()
            soak.log.figures.setdefault("attestation_probes_at_each_engine", []).append(stats["completions"])
            soak.log.figures.setdefault("hung_loads_at_each_engine", []).append(stats["hung_loads"])
        alerts = (await http.get(f"{soak.proxy}/v1/admin/alerts", params={"status": "all"})).json()
        soak.log.marks["attestation_alerts"] = sum(1 for a in alerts.get("data", []) if a.get("kind") == "attestation")


def adapter_rows(url: str) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(url) as conn:
        cur = conn.execute("SELECT alias, version, path, sha256, state FROM adapters ORDER BY id")
        return [dict(zip(("alias", "version", "path", "sha256", "state"), r, strict=True)) for r in cur]


def attestations(url: str, proxy_log: Path) -> dict[str, Any]:
    """Versions attested (rows), and the attestor's lines in the proxy's log (probes that differed, ...)."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM attestations").fetchone()
    text = proxy_log.read_text(errors="replace").splitlines()
    lines = [line for line in text if "attest" in line and "alembic" not in line]
    words = ("differs", "unverifiable", "attested ", "failed", "matches again")
    kinds = Counter(next((w.strip() for w in words if w in line), "other") for line in lines)
    odd = [line[-220:] for line in lines if "unverifiable" not in line][:3]
    return {"attestation_rows": row[0] if row else 0, "attestor_log_lines": dict(kinds), "attestor_other_lines": odd}


def report(soak: Soak, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    log, t0 = soak.log, soak.t0
    statuses = Counter(f"{c.kind}:{c.status}" for c in log.answers())
    chats = [c for c in log.calls if c.kind == "chat"]
    summary = {
        "seed": soak.args.seed,
        "minutes": soak.args.minutes,
        "clients": soak.args.clients,
        "ok": all(r["ok"] for r in results.values()),
        "checks": {k: {"ok": r["ok"], "checked": r["checked"], "failures": r["failures"]} for k, r in results.items()},
        "calls": len(chats),
        "calls_200_in_full": sum(c.complete for c in chats),
        "deletes": Counter(f"{d.kind}:{d.status}" for d in log.deletes),
        "batches": sum(not b.final for b in log.batches),
        "batch_items": sum(len(b.items) for b in log.batches),
        "final_batch_items": sum(len(b.items) for b in log.batches if b.final),
        "publishes": log.publishes,
        "deploy_s": [round(d.t_done - d.t_sent, 2) for d in log.deploys],
        "attestation_alerts": log.marks.get("attestation_alerts"),
        **log.figures,
        "soak_errors": dict(log.errors),
        "statuses": dict(sorted(statuses.items())),
        "marks": {k: round(v - t0, 1) for k, v in log.marks.items() if k != "attestation_alerts"},
    }
    print(orjson.dumps(summary, default=dict).decode(), flush=True)
    print(f"\n{'check':48} {'checked':>8} {'failures':>8}  result")
    for name, r in results.items():
        print(f"{name:48} {r['checked']:>8} {r['failures']:>8}  {'PASS' if r['ok'] else 'FAIL'}")
        for example in r["examples"]:
            print(f"    e.g. {example}")
    print(
        f"\ncalls {summary['calls']} ({summary['calls_200_in_full']} answered 200 in full), deletes "
        f"{dict(summary['deletes'])}, batches {summary['batches']} ({summary['batch_items']} items, "
        f"{summary['final_batch_items']} in the last), deploys {summary['deploy_s']} s, attestation alerts "
        f"{summary['attestation_alerts']}"
    )
    for name, value in log.figures.items():
        print(f"{name:48} {value}")
    print("RESULT: " + ("PASS" if summary["ok"] else "FAIL"), flush=True)
    return summary


def run(args: argparse.Namespace) -> int:
    print(f"machine: {machine_description()}")
    cluster = PgCluster()
    servers: list[Any] = []
    try:
        with tempfile.TemporaryDirectory(prefix="onthejob-soak-") as tmp:
            work = Path(tmp)
            cluster.start()
            for i in (1, 2):
                port = _port()
                servers.append(
                    start_proc(
                        f"stub{i}",
                        [PY, "-m", "bench.stub_upstream", "--port", str(port)],
                        port,
                        work,
                        ready_path="/v1/models",
                    )
                )
            stubs = [s.url for s in servers]
            env = {"ONTHEJOB_ATTEST_EVERY": "2", "ONTHEJOB_PROBE_EVERY": "1"}
            proxy = start_proxy(",".join(stubs), cluster.url, work / "spool", work, env=env)
            servers.append(proxy)
            soak = Soak(args, proxy.url, stubs, cluster, work)
            asyncio.run(scenario(soak))
            rows = {r[0] for r in rows_of(cluster.url)}
            adapters = adapter_rows(cluster.url)
            results = check(soak.log, rows, adapters, soak.t0)
            soak.log.figures["adapter_rows_by_state"] = dict(Counter(a["state"] for a in adapters))
            soak.log.figures.update(attestations(cluster.url, proxy.log))
            summary = report(soak, results)
            if not summary["ok"]:
                print(f"proxy log tail:\n{proxy.log.read_text()[-3000:]}")
    finally:
        for s in reversed(servers):
            s.stop()
        cluster.destroy()
    return 0 if summary["ok"] else 1


def _port() -> int:
    from bench.harness import free_port

    return free_port()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    run_within(run, args, args.minutes * 60 + 900)


if __name__ == "__main__":
    main()
