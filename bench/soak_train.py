"""The soak's trainers (bench/soak.py): batches assembled as ``train --watch`` does, and two publishers on one alias.

The batches go through the runner's own ``_next_batch`` (the incremental feed, holding a backlog of
``min_batch``, then ``storage.deletion.live``); no step is taken, so nothing is marked used and every
graded session is offered again when it changes. The publishers call trainer/publish.py's ``publish``
at the same moment (each save waits for the other's), with light adapters written by numpy from a
small config.json, and both versions are then deployed at once (``POST /v1/admin/deployments``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bench.soak_log import Batch, Call
from bench.soak_probes import send

if TYPE_CHECKING:
    from bench.soak import Soak

PROJECT, ALIAS, BASE_MODEL = "default", "agent", "stub-model"
LIGHT_CONFIG = {
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
}


def watch(soak: Soak) -> None:
    """A trainer's batches, the way ``train --watch`` assembles them (no step taken: nothing is marked used)."""
    from sqlalchemy.orm import Session

    from storage.changes import START
    from storage.db import sync_engine
    from storage.feed import TrainingFeed
    from trainer.runner import _next_batch
    from trainer.settings import TrainSettings

    settings = TrainSettings(alias=ALIAS, database_url=soak.cluster.url, project=PROJECT, batch_size=16, min_batch=8)
    feed = TrainingFeed(PROJECT, ALIAS, limit=16, min_batch=8, settle_s=2.0, position=START)
    engine = sync_engine(soak.cluster.url)
    try:
        while not soak.halt.is_set():
            soak.log.batches.extend(assemble(engine, settings, feed, _next_batch, Session, once=True))
            soak.halt.wait(1.0)
        # The last look, from the beginning of the log: every graded session, after every delete.
        last = replace(settings, batch_size=10_000, min_batch=1)
        feed = TrainingFeed(PROJECT, ALIAS, limit=10_000, settle_s=2.0, position=START)
        soak.log.batches.extend(assemble(engine, last, feed, _next_batch, Session, final=True))
    finally:
        engine.dispose()


def assemble(
    engine: Any, settings: Any, feed: Any, next_batch: Any, session: Any, *, once: bool = False, final: bool = False
) -> list[Batch]:
    out: list[Batch] = []
    for _ in range(1 if once else 1000):
        t = time.time()
        try:
            with session(engine) as db:
                trajectories, _, _ = next_batch(db, settings, feed)
        except Exception as exc:  # noqa: BLE001 - the database is down for a while: try again next time
            print(f"  batch failed: {type(exc).__name__}", flush=True)
            return out
        if not trajectories:
            break
        out.append(Batch(t, [(tr.session_id, list(tr.completion_ids)) for tr in trajectories], final))
    return out


class LightModel:
    """A model whose ``save_pretrained`` writes a light adapter once the other trainer is saving too."""

    def __init__(self, config: Path, seed: int, barrier: threading.Barrier) -> None:
        self.config, self.seed, self.barrier = config, seed, barrier

    def save_pretrained(self, path: str) -> None:
        from engine.weights import ModelInfo
        from tests.adapters import light_adapter

        self.barrier.wait(timeout=60)  # a guard against a hang: both trainers are in publish() now
        light_adapter(ModelInfo(path=self.config, name=BASE_MODEL, sha256="b" * 64), Path(path), seed=self.seed)


def publish_two(soak: Soak, round_: int) -> list[int]:
    """Two trainers publish to the alias at the same moment; the versions they got."""
    from sqlalchemy.orm import Session

    from engine.weights import ModelInfo
    from storage.db import sync_engine
    from trainer.publish import publish

    barrier, got, base = threading.Barrier(2), [], ModelInfo(path=soak.work, name=BASE_MODEL, sha256="b" * 64)

    def trainer(who: int) -> None:
        engine = sync_engine(soak.cluster.url)
        started = time.time()
        try:
            with Session(engine) as db:
                row = publish(
                    db,
                    LightModel(soak.work, 100 * round_ + who, barrier),
                    root=soak.work / "adapters",
                    project_id=PROJECT,
                    alias=ALIAS,
                    parent_version=None,
                    base=base,
                    run_id=None,
                    metrics={"round": round_, "trainer": who},
                )
                got.append(row.version)
                soak.log.publishes.append(
                    {
                        "round": round_,
                        "trainer": who,
                        "version": row.version,
                        "seconds": round(time.time() - started, 2),
                    }
                )
        except Exception as exc:  # noqa: BLE001 - counted and reported
            barrier.abort()
            soak.log.errors[f"publish: {type(exc).__name__}: {exc}"[:200]] += 1
        finally:
            engine.dispose()

    threads = [threading.Thread(target=trainer, args=(w,)) for w in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(got)


async def train_and_deploy(soak: Soak, http: httpx.AsyncClient, round_: int) -> None:
    versions = await asyncio.to_thread(publish_two, soak, round_)
    soak.mark(f"round {round_}: published {versions}")

    async def deploy(v: int) -> None:
        d = Call("deploy", None, None, time.time(), detail=f"{ALIAS}@v{v}")
        soak.log.deploys.append(
            await send(
                http, d, "POST", f"{soak.proxy}/v1/admin/deployments", json={"alias": ALIAS, "version": v}, timeout=180
            )
        )

    await asyncio.gather(*(deploy(v) for v in versions))
    took = [round(d.t_done - d.t_sent, 2) for d in soak.log.deploys[-len(versions) :]]
    soak.mark(f"round {round_}: deployed {versions} in {took} s")
