"""Per-replica probes (proxy/engine_adapters.py): one engine hung in ``load_lora_adapter`` holds up its own probe
only; the other engine's probe loads what it needs and puts it in rotation meanwhile. Two stub engines
(bench/stub_upstream.py: faults the real engine cannot produce on demand), in this process; no database
(the adapter's path is known to the router already)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from aiohttp.test_utils import TestServer

from bench import stub_upstream
from proxy.metrics import Metrics
from proxy.routing import Router
from proxy.upstream import Upstream


@contextlib.asynccontextmanager
async def _router_over_a_hung_and_a_good_engine() -> AsyncIterator[Router]:
    """A router over two stub engines, the first hung in every load; its load timeout past the test's end."""
    hung, good = TestServer(stub_upstream.make_app(hang_loads=True)), TestServer(stub_upstream.make_app())
    await hung.start_server()
    await good.start_server()
    urls = [str(hung.make_url("")).rstrip("/"), str(good.make_url("")).rstrip("/")]
    upstream = Upstream(urls, connect_timeout=5, idle_timeout=3600)
    router = Router(cast(Any, None), upstream, Metrics(), "default")
    router.load_timeout_s = 3600  # the hung load must still be hanging when the test looks
    stub_upstream.ADAPTERS.clear()
    stub_upstream.STATS["hung_loads"] = 0
    try:
        yield router
    finally:
        for task in router._followups:
            task.cancel()
        await upstream.close()
        await hung.close()
        await good.close()


async def _hung_load_does_not_stop_the_other_probe() -> dict[str, Any]:
    async with _router_over_a_hung_and_a_good_engine() as router:
        router._aliases = {("default", "x"): (stub_upstream.MODEL, 1)}  # x routes to x@v1
        router._paths[("default", "x", 1)] = "/adapters/x/v1"
        a, b = router.replicas.replicas
        stuck = asyncio.create_task(router.probe(a))
        try:
            while stub_upstream.STATS["hung_loads"] == 0:  # until engine a holds the load request unanswered
                await asyncio.sleep(0.01)
            await router.probe(b)  # with one lock for every engine this waited for a's load
            return {"a_probe_done": stuck.done(), "b_up": b.up, "b_lists": "x@v1" in b.models, "a_up": a.up}
        finally:
            stuck.cancel()


def test_a_hung_load_into_one_engine_does_not_stop_the_others_probe() -> None:
    seen = asyncio.run(_hung_load_does_not_stop_the_other_probe())
    assert seen == {"a_probe_done": False, "b_up": True, "b_lists": True, "a_up": False}


async def _stage_with_one_engine_hung() -> dict[str, Any]:
    async with _router_over_a_hung_and_a_good_engine() as router:
        router.stage_grace_s = 0.2
        router._paths[("default", "x", 2)] = "/adapters/x/v2"
        await router.discover()
        report = await asyncio.wait_for(router.stage("default", "x", 2), 300)  # a guard against a hang only
        return {
            "report": report,
            "still_loading": len(router._followups),
            "hung_loads": stub_upstream.STATS["hung_loads"],
        }


def test_a_hung_engine_is_pending_and_the_deployment_goes_on() -> None:
    """Staging answers once one engine has the version and the rest had their grace: the hung one is
    ``pending``, its load still going on (before, the deployment waited for its 120 s load timeout)."""
    seen = asyncio.run(_stage_with_one_engine_hung())
    hung_url, good_url = list(seen["report"])
    assert seen == {"report": {hung_url: "pending", good_url: "loaded"}, "still_loading": 1, "hung_loads": 1}
