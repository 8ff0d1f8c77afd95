"""Promotion rules: paired and independent comparisons, the gate and canary verdicts, policies and parents."""

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
    assert verdicts.canary_verdict(worse, None, 0.05, 2.0, min_sample=30)[0] is None
    big_worse = verdicts.compare(verdicts.Stats(40, 0.2, 0.05), verdicts.Stats(40, 0.8, 0.05))
    assert verdicts.canary_verdict(big_worse, None, 0.05, 2.0, min_sample=30)[0] == "rolled_back"
    same = verdicts.compare(verdicts.Stats(400, 0.8, 0.01), verdicts.Stats(400, 0.8, 0.01))
    assert verdicts.canary_verdict(same, None, 0.05, 2.0, min_sample=30)[0] == "promoted"
    noisy = verdicts.compare(verdicts.Stats(40, 0.75, 0.1), verdicts.Stats(40, 0.8, 0.1))
    assert verdicts.canary_verdict(noisy, None, 0.05, 2.0, min_sample=30)[0] is None  # not clear yet
    bad_eval = verdicts.compare(verdicts.Stats(48, 0.3, 0.04), verdicts.Stats(48, 0.7, 0.04))
    assert verdicts.canary_verdict(same, bad_eval, 0.05, 2.0, min_sample=30)[0] == "rolled_back"


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
