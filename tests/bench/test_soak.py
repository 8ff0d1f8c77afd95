"""bench/soak.py: its checks fail on each kind of violation they look for, and a short soak passes them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak_log import Batch, Call, Log, check, envelope_ok
from tests.adapters import light_adapter
from trainer.publish import content_sha256

ROOT = Path(__file__).resolve().parents[2]
ERROR = b'{"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": null}}'


def chat(session: str, sent: float, rid: str, done: float | None = None) -> Call:
    return Call("chat", session, None, sent, done if done is not None else sent + 0.1, 200, rid, complete=True)


def delete(session: str, sent: float, status: int = 200) -> Call:
    body, ctype = (b"", "application/json") if status < 300 else (ERROR, "application/json")
    return Call("delete_session", session, None, sent, sent + 0.1, status, body=body, content_type=ctype)


def failures(log: Log, rows: set[str], adapters: list[dict[str, object]] | None = None) -> dict[str, int]:
    return {name: r["failures"] for name, r in check(log, rows, adapters or [], 0.0).items() if r["failures"]}


def test_a_200_missing_without_a_later_delete_is_lost() -> None:
    log = Log(
        calls=[chat("customer-1", 1, "a"), chat("customer-1", 5, "b"), chat("customer-3", 1, "c")],
        deletes=[delete("customer-1", 3), delete("customer-3", 0, status=503)],
    )
    # a: deleted by the delete at 3 (sent after it); b: sent after the delete answered, must be there;
    # c: its session's delete failed, so it must be there too.
    assert failures(log, rows=set()) == {"every_200_recorded_or_deleted": 2}
    assert failures(log, rows={"b", "c"}) == {}


def test_a_call_answered_before_its_delete_must_not_land() -> None:
    log = Log(calls=[chat("customer-1", 1, "a")], deletes=[delete("customer-1", 3)])
    assert failures(log, rows={"a"}) == {"no_deleted_call_landed": 1}


def test_an_end_user_delete_covers_their_sessions_only() -> None:
    mine, theirs = chat("customer-2", 1, "a"), chat("customer-3", 1, "b")  # customer-2 is user-2's; 3 nobody's
    log = Log(calls=[mine, theirs], deletes=[Call("delete_end_user", None, "user-2", 3, 3.1, 200)])
    assert failures(log, rows={"b"}) == {}
    assert failures(log, rows=set()) == {"every_200_recorded_or_deleted": 1}


def test_a_batch_after_the_delete_may_hold_only_later_calls() -> None:
    calls = [chat("customer-1", 1, "old"), chat("customer-1", 5, "new")]
    deletes = [delete("customer-1", 3)]
    before = Log(calls=calls, deletes=deletes, batches=[Batch(2, [("customer-1", ["old"])])])
    assert failures(before, rows={"new"}) == {}  # trained before the delete was asked for
    later = Log(calls=calls, deletes=deletes, batches=[Batch(6, [("customer-1", ["new"])])])
    assert failures(later, rows={"new"}) == {}
    stale = Log(calls=calls, deletes=deletes, batches=[Batch(6, [("customer-1", ["old", "new"])])])
    assert failures(stale, rows={"new"}) == {"no_deleted_session_in_a_batch": 1}


def test_an_adapter_folder_must_hash_to_its_row(tmp_path: Path) -> None:
    config = tmp_path / "model"
    config.mkdir()
    (config / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 8,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "intermediate_size": 16,
                "num_hidden_layers": 1,
            }
        )
    )
    from engine.weights import ModelInfo

    folder = light_adapter(ModelInfo(path=config, name="m", sha256="b" * 64), tmp_path / "v1")
    good = {"alias": "a", "version": 1, "path": str(folder), "sha256": content_sha256(folder), "state": "committed"}
    assert failures(Log(), set(), [good]) == {}
    wrong = {**good, "version": 2, "sha256": "0" * 64}
    gone = {**good, "version": 3, "path": str(tmp_path / "nowhere")}
    reserved = {**gone, "version": 4, "path": str(tmp_path / "v4"), "state": "reserved"}  # a crashed publish: no folder
    assert failures(Log(), set(), [good, wrong, gone, reserved]) == {
        "every_adapter_folder_hashes_to_its_sha256": 2 + 1  # wrong, gone, and one path named by two rows
    }


def test_error_bodies_in_their_dialects_shape() -> None:
    def answer(body: bytes, ctype: str = "application/json", dialect: str = "openai") -> Call:
        return Call("probe", None, None, 0, 1, 500, body=body, content_type=ctype, dialect=dialect)

    assert envelope_ok(answer(ERROR))
    assert not envelope_ok(answer(b"Internal Server Error", "text/plain"))
    assert not envelope_ok(answer(b'{"detail": "Not Found"}'))
    assert not envelope_ok(answer(ERROR, dialect="anthropic"))
    assert envelope_ok(
        answer(b'{"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}', dialect="anthropic")
    )
    log = Log(calls=[answer(b"Internal Server Error", "text/plain")])
    assert failures(log, set()) == {"no_plain_text_error_body": 1}


def test_a_refusal_for_want_of_a_replica_while_one_listed_the_model() -> None:
    body = b'{"error": {"message": "no engine replica may serve default~agent@v3", "type": "server_error"}}'
    refused = Call("chat", "customer-1", None, 10, 10.2, 502, body=body, content_type="application/json")
    listed = Log(calls=[refused], health=[(10.1, "stub1", frozenset({"stub-model", "default~agent@v3"}))])
    assert failures(listed, set()) == {"no_replica_refusal_while_one_was_healthy": 1}
    unlisted = Log(calls=[refused], health=[(10.1, "stub1", frozenset({"stub-model"}))])
    assert failures(unlisted, set()) == {}
    deploy = Call("deploy", None, None, 20, 21, 502, body=ERROR, content_type="application/json")
    assert failures(Log(deploys=[deploy]), set()) == {"no_replica_refusal_while_one_was_healthy": 1}


@pytest.mark.slow
def test_a_short_soak_passes_every_check() -> None:
    """The soak itself, 18 s of load (two publishes, the hang, the restart): CI keeps it working."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "0.3", "--seed", "0", "--clients", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"seed"')))
    assert summary["ok"] and set(summary["checks"]) == {
        "every_200_recorded_or_deleted",
        "no_deleted_call_landed",
        "no_deleted_session_in_a_batch",
        "every_adapter_folder_hashes_to_its_sha256",
        "no_plain_text_error_body",
        "no_replica_refusal_while_one_was_healthy",
    }
    assert all(c["checked"] > 0 for name, c in summary["checks"].items() if name != "no_plain_text_error_body")
    assert sorted(p["version"] for p in summary["publishes"]) == [1, 2, 3, 4]
    assert {"database stopped", "database started"} <= set(summary["marks"])
    assert summary["deletes"].get("delete_session:200", 0) > 0
