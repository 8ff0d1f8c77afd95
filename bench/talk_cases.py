"""The two failures from the talk, simulated end to end through the proxy, and how fast the monitors see them.

A scripted policy drives a harness whose tool layer injects faults; each phase of a scenario is
served by one adapter version, deployed through the proxy's admin API (with the stub upstream,
versions are names; with the real engine, zero-initialised LoRA adapters, so the engine's text
is the base model's and the scripted policy decides every action and length). After every
batch of sessions the proxy is drained and the monitors run with the documented defaults
(only ``settle_s`` is 0: the harness grades a session before the batch ends).

Scenarios (7 phases of ``--sessions`` sessions each: the base model, then v1..v6):

* ``short`` (case 1): the tool layer fails 10 % of tool calls from v1 on; from v2 on the final
  answer is 15 % shorter per version, compounding (v2 0.85x, v3 0.72x, v4 0.61x, ...).
* ``flood`` (case 2): from v1 on a share of sessions (10 % more per version: v1 10 %, v2 20 %,
  ...) floods 12 tool calls; the harness's deadline is 8 tool calls, so the next model call is
  cut (the harness closes the stream: ``client_disconnected``) and, as in the talk, the harness
  drops the attempt: no grade is posted.
* ``clean``: the same lengths, no fault, no drift (noise only): every alert is a false alarm.

Each new version is published as the trainer publishes it (``candidate: true``) under the alias's
promotion policy (``--policy``): ``auto`` routes it at once; ``gate`` routes it once its eval is in
(the harness posts one per version, the same score on the same items: the talk's failures do not
show in an eval); ``canary`` routes a sticky share of sessions to it until it is promoted or
rolled back. The drift follows the lineage: a version is one step of drift beyond the version that
served when it was published (held versions are never parents), so under ``auto`` version N is N
steps, and after a rollback the next version starts again from what serves. A tool layer's faults
belong to the environment: they start at a point in time, for every version alike. After each
batch the harness asks the proxy to decide (``POST .../promotions/decide``; its own loop is off),
so decisions fall between batches and each run is reproducible.

Per session the clean policy makes 1 + Binomial(4, 1/2) tool calls (8-token thoughts), then a
final answer of ~40 tokens (uniform 0.6x-1.4x), graded outcome success with probability 0.7.

    python -m bench.talk_cases [--upstream stub|tiny] [--seeds 5] [--sessions 30] [--policy auto|gate|canary]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.talk_harness import Harness
from bench.talk_scenarios import (
    ALIAS,
    BATCH,
    CLEAN_SEEDS,
    DECIDED,
    EVAL,
    EXPECTED,
    MAX_SESSIONS,
    POLICIES,
    Decision,
    Phase,
    Run,
    scenario,
)


async def _drained(client: httpx.AsyncClient, proxy: str) -> None:
    for _ in range(600):
        if (await client.get(f"{proxy}/readyz")).json()["spool"]["depth"] == 0:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the proxy's spool did not drain")


async def _decided(client: httpx.AsyncClient, aliases: str, version: int) -> dict[str, Any] | None:
    """Ask the proxy to decide now; the final decision recorded for ``version`` (with its evidence), if any."""
    (await client.post(f"{aliases}/promotions/decide")).raise_for_status()
    events = (await client.get(f"{aliases}/promotions")).json()["data"]
    return next((e for e in reversed(events) if e["version"] == version and e["decision"] in DECIDED), None)


async def simulate(
    name: str,
    seed: int,
    proxy: str,
    sessionmaker: async_sessionmaker[AsyncSession],
    project: str,
    sessions: int = 30,
    stop_on: Sequence[str] = (),
    phases: Sequence[Phase] | None = None,
    alias: str = ALIAS,
    batch: int = BATCH,
    stub: bool = False,
    policy: str = "auto",
    max_sessions: int = MAX_SESSIONS,
) -> Run:
    """Run one scenario (or ``phases``) through the proxy; the alias and versions 1..6 must exist (:func:`prepare`).

    Phase ``t`` publishes ``phases[t].version`` and runs at least ``sessions`` sessions, and until the policy
    has decided on it (at most ``max_sessions``). A session behaves as the drift level of the version that
    serves it says (``phases[level]``), with the tool faults of the time (``phases[t].tool_fail``).
    """
    from proxy.promotion import bucket
    from storage.alerts import list_alerts
    from storage.monitor_store import run_monitors

    phases = list(phases if phases is not None else scenario(name))
    run, rng, done = Run(name, seed, sessions, policy), random.Random(seed), 0
    share = float(POLICIES[policy].get("share", 0.0)) if policy == "canary" else 0.0
    aliases = f"{proxy}/v1/admin/aliases/{alias}"
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=300) as client:
        harness = Harness(proxy, alias, client, {"stub_gap_ms": 50} if stub else {})
        for method, path, body in (
            ("PUT", "monitors", {"settle_s": 0}),
            ("PUT", "policy", POLICIES[policy]),
            ("POST", "versions/base/evals", EVAL),
        ):
            (await client.request(method, f"{aliases}/{path}", json=body)).raise_for_status()
        serving: int | None = None
        levels: dict[int | None, int] = {None: 0}
        for now in phases:
            run.starts.append(done)
            pending, record, n = now.version, None, 0
            # The base model is deployed (manual: the proxy routes the alias before the first call); each new
            # version is published as the trainer publishes it, and its eval posted.
            dep = {"alias": alias, "version": pending, "candidate": pending is not None}
            (await client.post(f"{proxy}/v1/admin/deployments", json=dep)).raise_for_status()
            if pending is not None:
                levels[pending] = levels[serving] + 1
                record = Decision(pending, levels[pending])
                run.decisions.append(record)
                (await client.post(f"{aliases}/versions/{pending}/evals", json=EVAL)).raise_for_status()
            while True:
                if pending is not None and record is not None and (event := await _decided(client, aliases, pending)):
                    record.decision, record.after = event["decision"], n
                    record.alerts = [f"{a['name']}@v{a['version']}" for a in event["evidence"].get("alerts", [])]
                    serving, pending = (pending if record.decision == "promoted" else serving), None
                if n >= max_sessions or (pending is None and n >= sessions) or stop_on and _seen(run, stop_on):
                    break
                ids = range(n, n + min(batch, (sessions if n < sessions else max_sessions) - n))
                sids = [f"{name}-{seed}-{now.version}-{i}" for i in ids]
                arms = [
                    pending if pending is not None and bucket(project, alias, sid) < share else serving for sid in sids
                ]
                if record is not None and pending is not None:
                    record.served += sum(arm == pending for arm in arms)
                acts = [replace(phases[min(levels[arm], len(phases) - 1)], tool_fail=now.tool_fail) for arm in arms]
                seeds = [rng.random() for _ in ids]
                await asyncio.gather(
                    *(
                        harness.session(sid, act, random.Random(s))
                        for sid, act, s in zip(sids, acts, seeds, strict=True)
                    )
                )
                n, done = n + len(ids), done + len(ids)
                await _drained(client, proxy)
                async with sessionmaker() as db:
                    report = await run_monitors(db, project, alias)
                    await db.commit()
                    if report.opened:
                        opened = {a.id: a for a in await list_alerts(db, project, alias=alias)}
                        for aid in report.opened:
                            a = opened[aid]
                            against = a.detail.get("against")
                            run.opened.append(
                                {
                                    "monitor": a.name,
                                    "version": a.version,
                                    "session": done,
                                    "against": against,
                                    "message": a.message,
                                }
                            )
            if record is not None and record.decision is None:
                record.after = n  # undecided: sessions its phase ran
            if stop_on and _seen(run, stop_on):
                break
    run.calls, run.seconds, run.sessions_run = harness.calls, time.monotonic() - started, done
    return run


def _seen(run: Run, monitors: Sequence[str]) -> bool:
    return {a["monitor"] for a in run.opened} >= set(monitors)


async def prepare(
    sessionmaker: async_sessionmaker[AsyncSession], project: str, base_model: str, path: str, alias: str = ALIAS
) -> None:
    """The alias and adapter rows v1..v6 (all the same weights: the scripted policy makes the difference)."""
    from storage.models import Adapter, Alias, Project

    async with sessionmaker() as db:
        if await db.get(Project, project) is None:
            db.add(Project(id=project, settings={}))
            await db.flush()
        if await db.scalar(select(Alias).where(Alias.project_id == project, Alias.name == alias)) is None:
            db.add(Alias(project_id=project, name=alias, base_model=base_model))
        for v in range(1, 7):
            db.add(
                Adapter(project_id=project, alias=alias, version=v, path=path, sha256="0" * 64, base_model=base_model)
            )
        await db.commit()


def zero_adapter(model_path: Path, out: Path) -> Path:
    """A LoRA adapter of the model whose B matrices are zero (PEFT's initialisation): it changes nothing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(out)
    return out


def _drifts(name: str, level: int) -> bool:
    """Whether a version at this level of ``name``'s drift behaves otherwise than the base model's."""
    act = scenario(name)[min(level, 6)]
    return act.answer != 1.0 or act.flood > 0


def _summary(runs: list[Run]) -> None:
    print(f"\n{'scenario':>8} {'seed':>4} {'calls':>6} {'s':>6}  alerts (monitor@version after N sessions, vs)")
    for r in runs:
        seen = ", ".join(f"{a['monitor']}@v{a['version']} +{a['session']} ({a['against']})" for a in r.opened) or "none"
        print(f"{r.name:>8} {r.seed:>4} {r.calls:>6} {r.seconds:>6.0f}  {seen}")
    print(
        f"\npolicy {runs[0].policy if runs else '-'}: each version, its drift level, the decision, sessions since it "
        f"was published / of them on the candidate, [the decision's alerts]"
    )
    for r in runs:
        print(f"{r.name:>8} {r.seed:>4}  {'; '.join(map(str, r.decisions))}")
    print("\ndetection delay: sessions from the phase where the cause starts to the alert (median, max; missed)")
    for name, expected in EXPECTED.items():
        for monitor, phase in expected.items():
            delays = [r.delay(monitor, phase) for r in runs if r.name == name]
            got = [d for d in delays if d is not None]
            shown = f"{statistics.median(got):.0f}, {max(got)}" if got else "-"
            print(f"  {name:>6} {monitor:<18} {shown:>10}; missed {len(delays) - len(got)} of {len(delays)}")
        drifting = [d for r in runs if r.name == name for d in r.decisions if _drifts(name, d.level)]
        told = Counter(d.decision or "undecided" for d in drifting)
        print(f"  {name:>6} drifting versions: {', '.join(f'{k} {v}' for k, v in sorted(told.items())) or 'none'}")
    clean = [r for r in runs if r.name == "clean"]
    decided = [d for r in clean for d in r.decisions]
    print(
        f"false alarms: {sum(len(r.opened) for r in clean)} alert(s) over {len(clean)} clean run(s) of "
        f"{', '.join(str(r.sessions_run) for r in clean) or 0} sessions; versions promoted "
        f"{sum(d.decision == 'promoted' for d in decided)} of {len(decided)}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", choices=["stub", "tiny"], default="stub")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=30, help="sessions per phase (version)")
    ap.add_argument("--scenarios", default="short,flood,clean")
    ap.add_argument("--policy", choices=list(POLICIES), default="auto", help="the alias's promotion policy")
    ap.add_argument("--max-sessions", type=int, default=MAX_SESSIONS, help="sessions a phase runs at most")
    args = ap.parse_args()
    return asyncio.run(_main(args))


async def _main(args: argparse.Namespace) -> int:
    from bench.harness import free_port, machine_description, start_server, throwaway_database
    from storage.db import async_engine
    from storage.migrate import upgrade

    print(machine_description())
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        if args.upstream == "stub":
            port = free_port()
            engine = start_server(
                "stub",
                [sys.executable, "-m", "bench.stub_upstream", "--port", str(port)],
                port,
                logdir,
                ready_path="/v1/models",
            )
            model, path = "stub-model", str(logdir / "no-weights")
        else:
            from engine.weights import resolve_model

            info = resolve_model("tiny")
            port = free_port()
            cmd = [sys.executable, "-m", "onthejob.cli", "engine", "--model", "tiny", "--port", str(port)]
            engine = start_server("engine", cmd, port, logdir, ready_path="/v1/models", timeout_s=600)
            model, path = info.name, str(zero_adapter(info.path, logdir / "zero-adapter"))
        try:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for name in args.scenarios.split(","):
                    with throwaway_database() as db_url:
                        upgrade(db_url)
                        pport = free_port()
                        spool = str(logdir / f"spool-{pport}")
                        cmd = [
                            sys.executable,
                            "-m",
                            "onthejob.cli",
                            "serve",
                            "--upstream",
                            engine.url,
                            "--db",
                            db_url,
                            "--port",
                            str(pport),
                            "--spool",
                            spool,
                            "--no-auth",
                        ]
                        # Decisions only when the harness asks, after each batch's monitor pass: reproducible runs.
                        proxy = start_server("proxy", cmd, pport, logdir, env={"ONTHEJOB_PROMOTION_EVERY": "86400"})
                        eng = async_engine(db_url)
                        try:
                            maker = async_sessionmaker(eng, expire_on_commit=False)
                            await prepare(maker, "default", model, path)
                            run_seed = seed + CLEAN_SEEDS if name == "clean" else seed
                            run = await simulate(
                                name,
                                run_seed,
                                proxy.url,
                                maker,
                                "default",
                                args.sessions,
                                stub=args.upstream == "stub",
                                policy=args.policy,
                                max_sessions=args.max_sessions,
                            )
                            runs.append(run)
                            print(
                                f"{name} seed {seed}: {len(run.opened)} alert(s), {run.sessions_run} sessions, "
                                f"{run.calls} calls, {run.seconds:.0f} s; {'; '.join(map(str, run.decisions))}",
                                flush=True,
                            )
                        finally:
                            await eng.dispose()
                            proxy.stop()
        finally:
            engine.stop()
    _summary(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
