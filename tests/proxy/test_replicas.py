"""Choosing a replica (proxy/replicas.py) and which adapter versions stay loaded (proxy/engine_adapters.py), no I/O."""

from __future__ import annotations

from proxy.replicas import FAILS_TO_EJECT, ReplicaSet
from proxy.served import lora_name, needed_versions

A, B, C = "http://a", "http://b", "http://c"


def _set(*listed: list[str]) -> ReplicaSet:
    """Replicas in rotation, each listing the base model ``m`` plus the given adapters."""
    replicas = ReplicaSet([A, B, C][: len(listed)])
    for replica, adapters in zip(replicas.replicas, listed, strict=True):
        replicas.answered(replica, [{"id": "m"}] + [{"id": name, "parent": "m"} for name in adapters])
        replicas.admit(replica)
    return replicas


def test_a_session_stays_on_its_replica_and_new_sessions_go_to_the_least_loaded() -> None:
    replicas = _set([], [], [])
    a, b, c = replicas.replicas
    a.inflight, b.inflight, c.inflight = 2, 0, 1
    assert replicas.pick("m", "s1") is b
    replicas.remember("s1", a)  # s1's previous turn ran on a
    assert replicas.pick("m", "s1") is a  # busier, but it holds the conversation's prefix cache
    b.inflight = 5
    assert replicas.pick("m", "new") is c
    c.inflight = 0
    b.inflight = 0
    a.inflight = 0
    assert {replicas.pick("m", f"n{i}") for i in range(3)} == {a, b, c}  # ties are taken in turn


def test_only_replicas_listing_the_version_and_not_excluded_from_it_get_its_calls() -> None:
    replicas = _set(["x@v1"], [], ["x@v1"])
    a, b, c = replicas.replicas
    replicas.remember("s", b)
    assert replicas.pick("x@v1", "s") in (a, c)  # b lacks the version: affinity yields
    replicas.exclude(A, "x@v1")  # e.g. a failed attestation
    assert all(replicas.pick("x@v1", f"t{i}") is c for i in range(4))
    assert replicas.pick("m", "u") is not None  # the base model is still served by all three
    replicas.include(A, "x@v1")
    assert a in {replicas.pick("x@v1", f"v{i}") for i in range(4)}


def test_a_refused_connect_ejects_at_once_and_5xx_after_a_streak() -> None:
    replicas = _set([], [])
    a, b = replicas.replicas
    assert replicas.failed(a, "ClientConnectorError", eject=True) and not a.up
    assert all(replicas.pick("m", f"s{i}") is b for i in range(3))
    assert replicas.pick("m", "s", tried=frozenset({B})) is a  # nothing else left: try it anyway
    for _ in range(FAILS_TO_EJECT - 1):
        assert not replicas.failed(b, "HTTP 500", eject=False) and b.up
    replicas.succeeded(b)  # a success ends the streak
    assert not replicas.failed(b, "HTTP 500", eject=False)
    assert replicas.admit(a) and a.up and a.fails == 0
    for _ in range(FAILS_TO_EJECT - 1):
        replicas.failed(b, "HTTP 500", eject=False)
    assert not b.up and not replicas.admit(b)  # it still lists its models: held out a while all the same
    b.held_until = 0
    assert replicas.admit(b) and b.up


def test_fallbacks_never_refuse_a_call_that_could_succeed() -> None:
    replicas = _set([], [])
    a, b = replicas.replicas
    assert replicas.pick("y@v3", "s") in (a, b)  # nobody lists it yet (another worker deployed it): try one
    replicas.unreachable(a, "timeout")
    replicas.unreachable(b, "timeout")
    assert replicas.pick("m", "s") in (a, b)  # all out of rotation: one may be back before the probe saw it
    assert replicas.pick("m", "s", tried=frozenset({A, B})) is None


def test_a_check_never_leaves_a_model_without_a_replica() -> None:
    replicas = _set(["x@v2"], ["x@v2"])
    a, b = replicas.replicas
    assert replicas.exclude(A, "x@v2") and "x@v2" in a.excluded  # b still serves it
    assert not replicas.exclude(B, "x@v2")  # the last one: refused, marked suspect, keeps serving
    assert "x@v2" not in b.excluded and "x@v2" in b.suspect and not replicas.servable("x@v2")
    assert all(replicas.pick("x@v2", f"s{i}") is b for i in range(4))
    replicas.unreachable(b, "timeout")  # the one allowed replica is gone: the excluded one is tried, not none
    assert replicas.pick("x@v2", "s", tried=frozenset({B})) is a
    replicas.include(B, "x@v2")
    assert b.state(set())["suspect"] == []
    solo = _set(["y@v1"])
    assert not solo.exclude(A, "y@v1") and solo.pick("y@v1", "s") is solo.replicas[0]


def test_needed_versions_are_the_routed_ones_plus_the_pinned() -> None:
    aliases = {("default", "x"): ("m", 2), ("default", "m"): ("m", None), ("acme", "x"): ("m", 1)}
    assert needed_versions(aliases) == {("default", "x", 2), ("acme", "x", 1)}
    assert needed_versions(aliases, {("default", "x", 3)}) == {
        ("default", "x", 2),
        ("acme", "x", 1),
        ("default", "x", 3),
    }
    assert (lora_name("default", "x", 2), lora_name("acme", "x", 1)) == ("x@v2", "acme~x@v1")
