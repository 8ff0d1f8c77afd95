"""Every call is counted by route, dialect, status and termination, timed, and its tokens added;
failed authentications on the call path slow down per client address. Real proxy, stub engine."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.conftest import ProxyFactory, make_key, metric_sample


def test_every_call_is_counted_timed_and_its_tokens_added(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    harness, admin = make_key(db_url, "default", "harness"), make_key(db_url, "default", "admin")
    proxy = start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    key = {"authorization": f"Bearer {harness}"}
    chat = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    operator = {"authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=proxy.v1, timeout=10) as c:
        # Verified before the failures below: a key this address already used keeps working while it waits.
        assert c.get(f"{proxy.url}/metrics", headers=operator).status_code == 200
        assert c.post("/chat/completions", json=chat, headers=key).status_code == 200
        with c.stream("POST", "/chat/completions", json={**chat, "stream": True}, headers=key) as s:
            assert s.status_code == 200 and s.read()
        done = c.post("/completions", json={"model": "stub-model", "prompt": "hi", "max_tokens": 5}, headers=key)
        assert done.status_code == 200
        assert (
            c.post("/chat/completions", json={"model": "stub-model", "messages": "no"}, headers=key).status_code == 400
        )
        wrong = [
            c.post("/chat/completions", json=chat, headers={"authorization": f"Bearer otj-wrong-{i}"})
            for i in range(11)
        ]
        metrics = c.get(f"{proxy.url}/metrics", headers=operator).text
    assert [r.status_code for r in wrong] == [401] * 10 + [429]  # the 11th failure from this address waits
    assert wrong[-1].json()["error"]["code"] == "too_many_failed_authentications"

    def calls(**labels: str) -> float | None:
        return metric_sample(metrics, "onthejob_requests_total", **labels)

    assert calls(route="chat", dialect="chat", status="200", termination="length") == 2
    assert calls(route="completions", dialect="completions", status="200", termination="length") == 1
    assert calls(route="chat", dialect="chat", status="400", termination="refused") == 1
    assert calls(route="chat", dialect="chat", status="401", termination="refused") == 10
    assert calls(route="chat", dialect="chat", status="429", termination="refused") == 1
    chat_labels = {"route": "chat", "dialect": "chat"}
    assert metric_sample(metrics, "onthejob_request_seconds_count", **chat_labels) == 2
    assert metric_sample(metrics, "onthejob_time_to_first_token_seconds_count", **chat_labels) == 2
    assert metric_sample(metrics, "onthejob_tokens_total", **chat_labels, kind="completion") == 6
    assert metric_sample(metrics, "onthejob_tokens_total", **chat_labels, kind="prompt") == 32  # 16 per call
    assert (
        metric_sample(metrics, "onthejob_tokens_total", route="completions", dialect="completions", kind="completion")
        == 5
    )
    assert metric_sample(metrics, "onthejob_records_spooled_total") == 3  # the three answered calls, fsync'd

    # Where calls with an earlier assistant turn found their parent: a follow-up in this worker's memory;
    # a few-shot prompt nowhere, asked of the database once and then believed for a few seconds.
    opening = [{"role": "user", "content": "a fresh start"}]
    few_shot = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
    ]
    with httpx.Client(base_url=proxy.v1, timeout=10) as c:
        first = c.post("/chat/completions", json={**chat, "messages": opening}, headers=key)
        said = first.json()["choices"][0]["message"]
        follow = [*opening, said, {"role": "user", "content": "and?"}]
        second = c.post("/chat/completions", json={**chat, "messages": follow}, headers=key)
        assert second.headers["x-session-id"] == first.headers["x-session-id"]
        for _ in range(2):
            assert c.post("/chat/completions", json={**chat, "messages": few_shot}, headers=key).status_code == 200
        metrics = c.get(f"{proxy.url}/metrics", headers=operator).text
    found = {
        where: metric_sample(metrics, "onthejob_link_lookups_total", found_in=where)
        for where in ("memory", "none", "believed_none", "spool", "database")
    }
    assert found == {"memory": 1, "none": 1, "believed_none": 1, "spool": None, "database": None}
