"""PUT /v1/admin/project takes the judge, the reward rule, implicit feedback; GET /v1/admin/judge shows the gate."""

from __future__ import annotations

import httpx
from sqlalchemy.orm import Session

from storage.db import sync_engine
from storage.judge_config import JudgeSettings
from storage.judge_store import record_calibration
from tests.proxy.conftest import ProxyFactory, make_key

JUDGE = {"rubric": "Right answer, briefly.", "scale": [0, 100], "min_labelled": 4}


def test_judge_and_reward_settings_over_the_admin_api(
    start_proxy: ProxyFactory, stub_upstream: str, pg_factory: object
) -> None:
    url = pg_factory()  # type: ignore[operator]
    proxy = start_proxy(stub_upstream, url, auth=True)
    admin = {"authorization": f"Bearer {make_key(url, role='admin')}"}

    def put(body: object) -> httpx.Response:
        return httpx.put(f"{proxy.v1}/admin/project", headers=admin, json=body, timeout=10)

    assert httpx.get(f"{proxy.v1}/admin/judge", headers=admin, timeout=10).json()["configured"] is False
    for body, param in (
        ({"judge": {"rubric": "x", "mode": "pairwise"}}, "judge.mode"),
        ({"judge": {}}, "judge.rubric"),
        ({"reward": {"colour": 1}}, "reward"),
        ({"reward": {"labels": 3}}, "reward"),
        ({}, "settings"),
    ):
        bad = put(body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
    for skip in ([""], "RESULT:", ["x" * 201]):
        bad = put({"implicit_feedback_skip": skip})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("implicit_feedback_skip"), bad.text
    ok = put(
        {
            "judge": JUDGE,
            "reward": {"numeric": ["reward", "score"]},
            "implicit_feedback": True,
            "implicit_feedback_skip": ["RESULT:"],
        }
    )
    assert ok.status_code == 200, ok.text
    settings = ok.json()["settings"]
    assert settings["judge"]["rubric"] == JUDGE["rubric"] and settings["implicit_feedback"] is True
    assert settings["implicit_feedback_skip"] == ["RESULT:"]
    assert settings["reward"] == {"numeric": ["reward", "score"]}
    assert put({"redact": {"store_text": True, "patterns": []}}).json()["settings"]["judge"] == settings["judge"]

    state = httpx.get(f"{proxy.v1}/admin/judge", headers=admin, timeout=10).json()
    assert (state["configured"], state["accepted"], state["reason"]) == (True, False, "judge_uncalibrated")
    eng = sync_engine(url)
    with Session(eng) as db:
        record_calibration(
            db,
            "default",
            JudgeSettings.model_validate(JUDGE),
            n=8,
            unreadable=1,
            spearman=0.7,
            accuracy=0.75,
            threshold=50.0,
        )
        db.commit()
    eng.dispose()
    state = httpx.get(f"{proxy.v1}/admin/judge", headers=admin, timeout=10).json()
    assert state["accepted"] is True and state["calibration"]["spearman"] == 0.7
    assert state["fingerprint"] == JudgeSettings.model_validate(JUDGE).fingerprint()
