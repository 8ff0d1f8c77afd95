"""Calibrated fingerprints (proxy/attest.py): distance, noise recorded at deploy, tolerance from it, the
``unverifiable`` verdict; old greedy fingerprints still compared the old way. Hand-made fingerprints."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fingerprint import TOLERANCE, TOLERANCE_FLOOR, calibrate, distance, parse_probe, same, tolerance_of

TOKENS = ["a", "b", "c", "d"]


def fp(*logprobs: float, tokens: list[str] = TOKENS) -> dict[str, Any]:
    return {"kind": "calibrated", "tokens": tokens, "logprobs": list(logprobs)}


def test_distance_is_the_mean_absolute_difference_over_the_tokens_chosen_alike() -> None:
    assert distance(fp(-1, -2, -3, -4), fp(-1.1, -2, -2.9, -4.2)) == pytest.approx(0.1)
    # A near-tie flipped at the second token: it and the first are compared, the rest (another text) not.
    assert distance(fp(-1, -2, -3, -4), fp(-1.2, -2.1, -9, -9, tokens=["a", "x", "y", "z"])) == pytest.approx(0.15)
    assert distance(fp(-1, -2, -3, -4), fp(-1, -2, -3, -4, tokens=["x", "b", "c", "d"])) == float("inf")
    assert distance(fp(-1, -2, -3, -4), {"tokens": TOKENS, "logprobs": [-1.0]}) == float("inf")


def test_noise_is_the_largest_deviation_of_the_repeats_and_sets_the_tolerance() -> None:
    ref = fp(-1, -2, -3, -4)
    repeats = [fp(-1, -2, -3, -4), fp(-1.01, -2, -3, -4.01), fp(-1, -2.04, -3, -4)]  # 0, 0.005, 0.01
    got = calibrate([ref, *repeats], {"base": fp(-2, -3, -4, -5), "v1": fp(-1.2, -2.2, -3.2, -4.2)})
    assert got["noise"] == pytest.approx(0.01)
    assert got["tolerance"] == pytest.approx(0.03) == tolerance_of(got)
    assert got["separation"] == {"base": pytest.approx(1.0), "v1": pytest.approx(0.2)}
    assert got["verdict"] == "ok" and got["samples"] == 4 and got["logprobs"] == ref["logprobs"]
    assert same(got, fp(-1.02, -2.02, -3.02, -4.02))  # 0.02: within three times the noise
    assert not same(got, fp(-1.04, -2.04, -3.04, -4.04))  # 0.04: beyond
    assert not same(got, fp(-1.2, -2.2, -3.2, -4.2))  # the previous version swapped in


def test_a_noiseless_record_gets_the_floor() -> None:
    got = calibrate([fp(-1, -2, -3, -4)] * 3, {})
    assert got["noise"] == 0 and got["tolerance"] == TOLERANCE_FLOOR and got["verdict"] == "ok"


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
    reply = {"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1, -2]}}]}
    assert parse_probe(reply) == {"kind": "calibrated", "tokens": ["a", "b"], "logprobs": [-1.0, -2.0]}
    assert parse_probe(reply, "greedy") == {"tokens": ["a", "b"], "logprobs": [-1.0, -2.0]}
