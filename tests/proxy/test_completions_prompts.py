"""/v1/completions takes one prompt per call: several in a list are refused, not recorded with the first's ids."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.conftest import ProxyFactory


def test_several_prompts_are_refused_and_one_in_any_form_is_served(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: Any
) -> None:
    proxy = start_proxy(stub_upstream, pg_factory(), env={"ONTHEJOB_RATE_LIMIT_RPS": "0"})
    with httpx.Client(base_url=proxy.v1, timeout=10) as c:
        for prompt in (["first", "second"], [[1, 2], [3, 4]], ["a", [5]]):
            r = c.post("/completions", json={"model": "stub-model", "prompt": prompt})
            assert r.status_code == 400, (prompt, r.text)
            error = r.json()["error"]
            assert error["param"] == "prompt" and "one prompt per call" in error["message"], error
        for prompt in ("text", ["text"], [1, 2, 3], [[1, 2, 3]]):
            r = c.post("/completions", json={"model": "stub-model", "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200, (prompt, r.text)
