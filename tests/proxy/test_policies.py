"""Redaction policies survive a restart without the database, and an unknown one refuses instead of failing open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.policies import Policies, PolicyUnknown
from proxy.redact import MASK, RedactionPolicy, redact_text


def test_nothing_known_yet_refuses_with_a_clear_503(tmp_path: Path) -> None:
    with pytest.raises(PolicyUnknown) as info:
        Policies(tmp_path).get("acme")
    assert info.value.status == 503 and info.value.code == "redaction_policy_unknown"
    assert "acme" in info.value.message


def test_policies_read_from_the_database_are_kept_on_disk_for_the_next_start(tmp_path: Path) -> None:
    live = Policies(tmp_path)
    live.update(
        {
            "acme": {"redact": {"patterns": ["sk-[a-z0-9]+"]}},
            "quiet": {"redact": {"store_text": False}},
            "plain": {},
            "bare": None,
        }
    )
    assert redact_text("key sk-abc1", live.get("acme")) == f"key {MASK}"
    assert live.get("never-seen") == RedactionPolicy()  # the database answered and has no settings for it
    assert json.loads((tmp_path / "policies.json").read_text())["quiet"] == {"store_text": False}

    restarted = Policies(tmp_path)  # the database is down at this start
    restarted.load()
    assert redact_text("key sk-abc1", restarted.get("acme")) == f"key {MASK}"
    assert restarted.get("quiet").store_text is False and restarted.get("plain") == RedactionPolicy()
    with pytest.raises(PolicyUnknown):
        restarted.get("never-seen")  # maybe created with a policy since: unknown until the database answers
    restarted.update({"never-seen": {}})
    assert (
        restarted.get("never-seen") == RedactionPolicy() and restarted.get("acme") == RedactionPolicy()
    )  # the database rules


def test_an_unreadable_copy_leaves_every_project_unknown(tmp_path: Path) -> None:
    (tmp_path / "policies.json").write_text("{torn")
    policies = Policies(tmp_path)
    policies.load()
    with pytest.raises(PolicyUnknown):
        policies.get("acme")
