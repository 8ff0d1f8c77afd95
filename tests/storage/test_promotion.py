"""Promotion rules: paired and independent comparisons, the gate and canary verdicts (per task family),
policies and parents."""

from __future__ import annotations

import math
import uuid

import pytest
from sqlalchemy.orm import Session

from storage import promotion as store
from storage import verdicts
from storage.keys import ensure_project
from storage.models import Alias


def test_stats_mean_and_standard_error_by_hand() -> None:
    s = verdicts.Stats.of({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    assert s.mean == 2.5
    assert s.stderr == pytest.approx(math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3 / 4))


def test_same_items_are_compared_paired_with_a_smaller_standard_error() -> None:
    serving = verdicts.Stats.of({f"p{i}": float(i % 5) for i in range(40)})
    candidate = verdicts.Stats.of({f"p{i}": float(i % 5) - 0.5 for i in range(40)})  # every item 0.5 lower
    cmp = verdicts.compare(candidate, serving)
    assert cmp.paired and cmp.diff == pytest.approx(-0.5) and cmp.se == pytest.approx(0.0)
    assert verdicts.gate_verdict(cmp, margin=0.0, z=2.0) == "held"
    assert verdicts.gate_verdict(cmp, margin=0.6, z=2.0) == "promoted"  # within the margin
    unpaired = verdicts.compare(
        verdicts.Stats(40, candidate.mean, candidate.stderr), verdicts.Stats(40, serving.mean, serving.stderr)
    )
    assert not unpaired.paired and unpaired.se > 0.3
    assert verdicts.gate_verdict(unpaired, margin=0.0, z=2.0) == "promoted"  # not clear without pairing


def test_overlapping_item_sets_are_paired_over_the_shared_items_and_low_coverage_holds() -> None:
    serving = verdicts.Stats.of({f"p{i}": float(i % 5) for i in range(40)})
    # The candidate answered 38 of the 40 items (two errored), each 0.1 higher: paired over the 38.
    most = verdicts.Stats.of({f"p{i}": float(i % 5) + 0.1 for i in range(38)})
    cmp = verdicts.compare(most, serving)
    assert cmp.paired and cmp.diff == pytest.approx(0.1) and cmp.coverage == pytest.approx(38 / 40)
    assert verdicts.gate_verdict(cmp, margin=0.0, z=2.0) == "promoted"
    # Answering only 30 of 40 (75%) holds it whatever its scores: the missing items may be where it is worse.
    few = verdicts.compare(verdicts.Stats.of({f"p{i}": 4.0 for i in range(30)}), serving)
    assert few.coverage == pytest.approx(0.75) and verdicts.gate_verdict(few, margin=0.0, z=2.0) == "held"


def test_gate_holds_only_what_is_two_standard_errors_worse() -> None:
    serving = verdicts.Stats(48, 0.70, 0.05)
    assert verdicts.gate_verdict(verdicts.compare(verdicts.Stats(48, 0.60, 0.05), serving), 0.0, 2.0) == "promoted"
    assert verdicts.gate_verdict(verdicts.compare(verdicts.Stats(48, 0.55, 0.05), serving), 0.0, 2.0) == "held"
    assert verdicts.gate_verdict(verdicts.compare(verdicts.Stats(48, 0.90, 0.05), serving), 0.0, 2.0) == "promoted"


def test_canary_waits_for_its_sample_then_decides_either_way() -> None:
    worse = verdicts.compare(verdicts.Stats(10, 0.2, 0.05), verdicts.Stats(10, 0.8, 0.05))
    assert verdicts.canary_verdict(worse, {}, 0.05, 2.0, min_sample=30)[0] is None
    big_worse = verdicts.compare(verdicts.Stats(40, 0.2, 0.05), verdicts.Stats(40, 0.8, 0.05))
    assert verdicts.canary_verdict(big_worse, {}, 0.05, 2.0, min_sample=30)[0] == "rolled_back"
    same = verdicts.compare(verdicts.Stats(400, 0.8, 0.01), verdicts.Stats(400, 0.8, 0.01))
    assert verdicts.canary_verdict(same, {}, 0.05, 2.0, min_sample=30)[0] == "promoted"
    noisy = verdicts.compare(verdicts.Stats(40, 0.75, 0.1), verdicts.Stats(40, 0.8, 0.1))
    assert verdicts.canary_verdict(noisy, {}, 0.05, 2.0, min_sample=30)[0] is None  # not clear yet
    bad_eval = verdicts.compare(verdicts.Stats(48, 0.3, 0.04), verdicts.Stats(48, 0.7, 0.04))
    fine_eval = verdicts.compare(verdicts.Stats(48, 0.7, 0.04), verdicts.Stats(48, 0.7, 0.04))
    decision, why = verdicts.canary_verdict(same, {"arith": fine_eval, "support": bad_eval}, 0.05, 2.0, 30)
    assert (decision, why) == ("rolled_back", "eval support -0.400 ± 0.057 below the serving version")


def test_policy_settings_are_checked_by_field(db: Session) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ensure_project(db, project)
    with pytest.raises(store.PolicyError) as err:
        store.set_policy(db, project, "a", "gate", {"share": 0.2})
    assert err.value.param == "share"
    with pytest.raises(store.PolicyError):
        store.set_policy(db, project, "a", "canary", {"share": 1.5})
    with pytest.raises(store.PolicyError):
        store.set_policy(db, project, "a", "shadow", {})
    policy = store.set_policy(db, project, "a", "canary", {"share": 0.25})
    assert (policy.mode, policy.share, policy.margin, policy.min_sample) == ("canary", 0.25, 0.05, 30)
    assert store.get_policy(db, project, "other").mode == "auto"
    db.rollback()


def test_a_held_candidate_is_never_the_training_parent(db: Session) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ensure_project(db, project)
    db.add(Alias(project_id=project, name="a", base_model="m", deployed_version=2))
    db.flush()
    assert store.training_parent(db, project, "a") == (False, None)  # auto: the trainer's --parent decides
    store.set_policy(db, project, "a", "gate", {})
    store.set_candidate(db, project, "a", 3)  # v3 published, waiting (or held)
    assert store.training_parent(db, project, "a") == (True, 2)  # the next step starts from what serves
    db.rollback()


ITEMS = [f"p{i}" for i in range(20)]


def _evals(db: Session, project: str, version: int | None, **families: list[float]) -> None:
    """Hand-made eval rows: per family, one score per item of ITEMS (as a harness posts them)."""
    for name, scores in families.items():
        stats = verdicts.Stats.of(dict(zip(ITEMS, scores, strict=True)))
        store.add_eval(
            db, project, "a", version, name=name, n=stats.n, mean=stats.mean, stderr=stats.stderr, scores=stats.scores
        )


def _project(db: Session) -> str:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ensure_project(db, project)
    return project


HALF = [float(i % 2) for i in range(20)]  # the serving version: half the items right, in each family


def test_a_candidate_that_breaks_one_family_is_held_whatever_the_other_gains(db: Session) -> None:
    project = _project(db)
    _evals(db, project, None, arith=HALF, support=HALF)
    _evals(db, project, 1, arith=[1.0] * 20, support=[0.0] * 20)  # every arith item right, every support one wrong
    families = store.eval_families(db, project, "a", 1, None)
    assert sorted(families) == ["arith", "support"]
    assert families["arith"].diff == pytest.approx(0.5) and families["support"].diff == pytest.approx(-0.5)
    verdict, reason = verdicts.gate_families(families, 0.0, 2.0)
    assert verdict == "held"
    assert reason.startswith("worse on support (1 of 2 families). support: eval 0.000 vs serving 0.500: diff -0.500")
    assert "arith: eval 1.000 vs serving 0.500: diff +0.500" in reason
    evidence = verdicts.family_evidence(families, 0.0, 2.0)
    assert (evidence["eval"]["name"], evidence["eval"]["diff"]) == ("support", pytest.approx(-0.5))
    assert {k: v["gate"] for k, v in evidence["families"].items()} == {"arith": "promoted", "support": "held"}
    # Within a margin of 0.6 (eval units, per family) the broken family passes too.
    assert verdicts.gate_families(families, 0.6, 2.0)[0] == "promoted"
    db.rollback()


def test_a_candidate_no_family_finds_worse_is_promoted(db: Session) -> None:
    project = _project(db)
    _evals(db, project, None, arith=HALF, support=HALF)
    _evals(db, project, 1, arith=[1.0] * 20, support=HALF)  # better on arith, the same on support
    verdict, reason = verdicts.gate_families(store.eval_families(db, project, "a", 1, None), 0.0, 2.0)
    assert verdict == "promoted" and reason.startswith("no family worse (2 families). arith: eval 1.000")
    db.rollback()


def test_one_family_is_decided_as_before(db: Session) -> None:
    project = _project(db)
    _evals(db, project, None, arith=HALF, smoke=HALF)  # smoke: the serving version's only, not compared
    _evals(db, project, 1, arith=[x - 0.25 for x in HALF])
    families = store.eval_families(db, project, "a", 1, None)
    assert list(families) == ["arith"]
    cmp = families["arith"]
    assert verdicts.gate_families(families, 0.0, 2.0) == ("held", verdicts.gate_reason(cmp, 0.0, 2.0))
    assert verdicts.gate_verdict(cmp, 0.0, 2.0) == "held"
    assert verdicts.gate_reason(cmp, 0.0, 2.0) == (
        "eval 0.250 vs serving 0.500: diff -0.250 ± 0.000 (paired), clearly worse than margin 0.0 at z 2.0"
    )
    assert verdicts.family_evidence(families, 0.0, 2.0)["eval"] == cmp.to_dict() | {"name": "arith"}
    db.rollback()


def test_a_gate_with_families_waits_for_each_of_them(db: Session) -> None:
    project = _project(db)
    policy = store.set_policy(db, project, "a", "gate", {"families": ["arith", "support"]})
    assert policy.families == ("arith", "support") and policy.to_dict()["families"] == ["arith", "support"]
    _evals(db, project, None, arith=HALF, support=HALF, smoke=HALF)
    _evals(db, project, 1, arith=[1.0] * 20, smoke=HALF)
    assert store.eval_families(db, project, "a", 1, None, policy.families) == {}  # support not in yet
    assert list(store.eval_families(db, project, "a", 1, None)) == ["arith", "smoke"]  # no families: what both have
    _evals(db, project, 1, support=[0.0] * 20)
    assert list(store.eval_families(db, project, "a", 1, None, policy.families)) == ["arith", "support"]
    for bad in ([], ["x", "x"], ["x", 3], "x", [""]):
        with pytest.raises(store.PolicyError) as err:
            store.set_policy(db, project, "a", "gate", {"families": bad})
        assert err.value.param == "families"
    with pytest.raises(store.PolicyError):
        store.set_policy(db, project, "a", "canary", {"families": ["arith"]})  # canary compares whatever both have
    assert store.set_policy(db, project, "a", "gate", {"families": None}).families is None
    db.rollback()
