"""Prefix linking never joins calls of different API keys or different end users, and refuses to guess:
a follow-up that matches more than one live session starts a new one, flagged ``ambiguous_link``.

The stub engine answers every prompt alike, as greedy decoding of a fixed opening would.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.conftest import ProxyFactory, make_key, metric_sample


def test_linking_stays_within_a_key_and_an_end_user_and_refuses_to_guess(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    db_url = pg_factory()
    key_a, key_b = make_key(db_url, "acme", "harness"), make_key(db_url, "acme", "harness")
    operator = make_key(db_url, "default", "admin")
    proxy = start_proxy(stub_upstream, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    client = httpx.Client(base_url=proxy.v1, timeout=10)

    def call(key: str, messages: list[dict[str, Any]], **extra: Any) -> tuple[str, dict[str, Any]]:
        body = {"model": "stub-model", "messages": messages, "max_tokens": 3, **extra}
        r = client.post("/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return r.headers["x-session-id"], r.json()["choices"][0]["message"]

    def opening(n: int) -> list[dict[str, Any]]:
        return [{"role": "system", "content": f"Support agent #{n}."}, {"role": "user", "content": "Order late."}]

    def then(first: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
        return [*first, reply, {"role": "user", "content": "Still late."}]

    # Two API keys of one project, the same opening and the same first reply.
    a1, reply = call(key_a, opening(1))
    b1, same = call(key_b, opening(1))
    assert reply == same and a1 != b1
    assert call(key_a, then(opening(1), reply))[0] == a1
    assert call(key_b, then(opening(1), reply))[0] == b1

    # One key, two end users, named each way a client may name them.
    for n, (alice, bob) in enumerate(
        [
            ({"user": "alice"}, {"user": "bob"}),
            ({"metadata": {"user_id": "alice"}}, {"metadata": {"user_id": "bob"}}),
            ({"metadata": {"end_user": "alice"}}, {"metadata": {"end_user": "bob"}}),
        ],
        start=2,
    ):
        s_alice, reply = call(key_a, opening(n), **alice)
        s_bob, _ = call(key_a, opening(n), **bob)
        assert call(key_a, then(opening(n), reply), **alice)[0] == s_alice
        assert call(key_a, then(opening(n), reply), **bob)[0] == s_bob

    # One key, no end user, two live sessions with the same opening: which one goes on is unknowable.
    s1, reply = call(key_a, opening(9))
    s2, _ = call(key_a, opening(9))
    s3, _ = call(key_a, then(opening(9), reply))
    assert s3 not in (s1, s2)
    proxy.wait_drained()
    view = client.get(f"/sessions/{s3}", headers={"authorization": f"Bearer {key_a}"}).json()
    assert view["source"] == "ambiguous_link"
    metrics = client.get(f"{proxy.url}/metrics", headers={"authorization": f"Bearer {operator}"}).text
    assert metric_sample(metrics, "onthejob_ambiguous_links_total") == 1
    client.close()
