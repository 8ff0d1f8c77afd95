"""Message-level linking: a follow-up call finds its parent by its own message prefixes."""

from __future__ import annotations

from proxy.sessions import Link, LinkCache, link_key, naming, prefix_keys


def test_a_follow_up_finds_the_previous_turn() -> None:
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    reply = {"role": "assistant", "content": "a1", "refusal": None}
    key = link_key(prefix_keys(first)[-1], reply)
    # The SDK echoes the assistant message back with different optional fields; it still links.
    follow = [*first, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "42", "tool_call_id": "t"}]
    assert prefix_keys(follow)[2] == key
    cache = LinkCache()
    cache.put("p", key, Link("s1", "c1", None))
    assert cache.longest("p", prefix_keys(follow), None) == Link("s1", "c1", None)
    assert cache.longest("other-project", prefix_keys(follow), None) is None
    assert cache.longest("p", prefix_keys(follow), "another-session") is None
    changed = [*first[:1], {"role": "user", "content": "different"}, {"role": "assistant", "content": "a1"}]
    assert cache.longest("p", prefix_keys(changed), None) is None


def test_content_parts_and_tool_calls_normalise() -> None:
    a = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    b = [{"role": "user", "content": "hi"}]
    assert prefix_keys(a) == prefix_keys(b)
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}  # fmt: skip
    same = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "y", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert prefix_keys([call]) == prefix_keys([same])


def test_naming_sources() -> None:
    n = naming({"x-session-id": "s", "x-task-id": "t", "x-onthejob-tags": "eval, a"}, {}, None)
    assert (n.session_id, n.task_id, n.tags, n.source) == ("s", "t", ("eval", "a"), "header")
    n = naming({}, {"metadata": {"session_id": "m", "task_id": "t2", "tags": ["eval"]}}, "p")
    assert (n.session_id, n.task_id, n.tags, n.source) == ("m", "t2", ("eval",), "metadata")
    n = naming({}, {}, "p")
    assert (n.session_id, n.source) == ("p", "path")


def test_tool_call_arguments_link_whatever_their_whitespace() -> None:
    def turn(arguments: str) -> dict[str, object]:
        return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": arguments}}]}

    # As vLLM streams a guided call, as it returns one unstreamed, as a client resends a parsed one.
    streamed, returned, resent = turn('{\n    "x": "é"\n}'), turn('{"x": "é"}'), turn('{"x":"é"}')
    assert prefix_keys([streamed]) == prefix_keys([returned]) == prefix_keys([resent])
    assert prefix_keys([turn('{"x": 1}')]) != prefix_keys([turn('{"x": 2}')])
    assert prefix_keys([turn("not json {")]) == prefix_keys([turn("not json {")])
