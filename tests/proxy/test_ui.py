"""The dashboard at /ui in headless Chromium (the system's package, driven by selenium and the system chromedriver).

One proxy with auth in front of the real tiny engine records a few sessions (one prompt and one
comment carry markup and script); the page must show the API's numbers, lead from the traffic
list to a session to a token view, refuse a harness key's admin action and do an admin key's,
and never run what was recorded. Screenshots go to build/ui-screenshots/ (gitignored).
Promotion (a gate policy set in the page, a candidate held on its eval), datasets and a version's
lineage are shown as the admin API answers them, to a harness key too (read-only); an admin sets the
retention and deletes a session from the page, each after a confirmation.
Without Chromium the tests skip locally and fail under CI=true (.ci/run installs it).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.support.ui import Select, WebDriverWait
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from engine.launcher import Engine
from storage.db import sync_engine
from storage.mine_store import mine
from storage.models import CompletionFlag, TrainingRun, TrainingStep
from tests.adapters import light_adapter
from tests.proxy.conftest import Proxy, launch_proxy, make_key
from trainer.publish import record_adapter

pytestmark = pytest.mark.engine

HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
LOADS = itertools.count()
SHOTS = Path(__file__).resolve().parents[2] / "build" / "ui-screenshots"


@dataclass
class World:
    proxy: Proxy
    model: str
    harness: str
    admin: str
    other: str  # a harness key of another project, which has its own traffic
    hostile_call: str  # its prompt carries HOSTILE
    session: str  # two linked turns, a tool result, feedback with a HOSTILE comment

    def get(self, path: str, key: str | None = None, **params: Any) -> Any:
        resp = httpx.get(
            self.proxy.url + path, params=params, timeout=30, headers={"authorization": f"Bearer {key or self.admin}"}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    def send(self, method: str, path: str, body: Any, status: int = 201) -> Any:
        resp = httpx.request(
            method, self.proxy.url + path, json=body, timeout=60, headers={"authorization": f"Bearer {self.admin}"}
        )
        assert resp.status_code == status, resp.text
        return resp.json()


def _chat(w: World, key: str, session: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    resp = httpx.post(
        f"{w.proxy.v1}/chat/completions",
        timeout=120,
        headers={"authorization": f"Bearer {key}", "x-session-id": session, **extra},
        json={"model": w.model, "messages": messages, "max_tokens": 8, "seed": 1, "temperature": 1.0},
    )
    assert resp.status_code == 200, resp.text
    return resp


@pytest.fixture(scope="module")
def world(tiny_engine: Engine, pg_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    db_url = pg_factory()
    keys = [make_key(db_url, "default", "harness"), make_key(db_url, "default", "admin"), make_key(db_url, "other")]
    proxy = launch_proxy(
        tmp_path_factory.mktemp("ui"), tiny_engine.url, db_url, auth=True, env={"ONTHEJOB_RATE_LIMIT_RPS": "0"}
    )
    w = World(proxy, tiny_engine.model.name, *keys, hostile_call="", session="ui-linked")
    try:
        first = [{"role": "user", "content": f"Plan a trip. {HOSTILE}"}]
        r1 = _chat(w, w.harness, w.session, first)
        w.hostile_call = r1.headers["x-request-id"]
        reply = r1.json()["choices"][0]["message"]
        tool_turn = [
            *first,
            {"role": "assistant", "content": reply["content"] or ""},
            {"role": "user", "content": "Use the tool."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "trains"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Trains leave at 9."},
        ]
        r2 = _chat(w, w.harness, w.session, tool_turn)
        _chat(w, w.harness, "ui-eval", [{"role": "user", "content": "held out"}], **{"x-onthejob-tags": "eval"})
        _chat(w, w.other, "other-session", [{"role": "user", "content": "other project"}])
        proxy.wait_drained()
        for item in (
            {"target": {"completion_id": w.hostile_call}, "name": "reward", "value": 0.25, "source": "grader"},
            {"target": {"completion_id": w.hostile_call}, "name": "reward", "value": 0.75, "source": "grader"},
            {
                "target": {"completion_id": r2.headers["x-request-id"]},
                "name": "thumbs",
                "value": False,
                "comment": f"wrong station {HOSTILE}",
            },
        ):
            resp = httpx.post(
                f"{proxy.v1}/feedback", json=item, timeout=30, headers={"authorization": f"Bearer {w.harness}"}
            )
            assert resp.status_code == 201, resp.text
        yield w
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        message = "headless Chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_script_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def _open(driver: Any, w: World, key: str, view: str = "traffic") -> None:
    """Load the page afresh with no key, enter ``key`` in its form, wait for the view."""
    driver.get(f"{w.proxy.url}/ui")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{w.proxy.url}/ui?load={next(LOADS)}#/{view}")  # a new URL: a full load, not a hash change
    _wait(driver, "key")
    driver.find_element("id", "key").send_keys(key)
    driver.find_element("css selector", "#keyform button").click()
    _wait(driver, view.split("/")[0].split("?")[0])


def _wait(driver: Any, view: str) -> None:
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.documentElement.dataset.ready") == view)


def _goto(driver: Any, href_contains: str, view: str) -> None:
    link = driver.find_element("css selector", f"#view a[href*='{href_contains}']")
    link.click()
    _wait(driver, view)


def _shown(driver: Any, key: str) -> str:
    return str(driver.find_element("css selector", f"[data-k='{key}']").text)


def _errors(driver: Any) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", "#view .notice.error")]


def test_numbers_shown_are_the_apis(world: World, browser: Any) -> None:
    w = world
    calls = w.get("/v1/chat/completions", limit=500)["data"]
    feedback = w.get("/v1/feedback")["data"]
    _open(browser, w, w.harness)
    assert _errors(browser) == []
    assert int(_shown(browser, "calls")) == len(calls) == 3
    assert int(_shown(browser, "matching")) == len(calls)
    assert int(_shown(browser, "sessions")) == len({c["onthejob"]["session_id"] for c in calls})
    assert int(_shown(browser, "feedback")) == len(feedback) == 3
    rows = browser.find_elements("css selector", "#calls tbody tr")
    assert [r.find_element("css selector", "td:nth-child(2)").text for r in rows] == [c["id"] for c in calls[::-1]]
    browser.save_screenshot(str(SHOTS / "traffic.png"))
    # Filtered server-side: the eval-tagged call alone, then the graded ones.
    browser.get(f"{w.proxy.url}/ui#/traffic?tag=eval")
    _wait(browser, "traffic")
    assert int(_shown(browser, "matching")) == 1
    browser.get(f"{w.proxy.url}/ui#/traffic?grade=graded")
    _wait(browser, "traffic")
    assert int(_shown(browser, "matching")) == len({f["completion_id"] for f in feedback}) == 2
    # Failure modes `onthejob mine` flagged: the tiny model's 8-token replies are cut at the length limit.
    eng = sync_engine(w.proxy.db_url)
    with Session(eng) as db:
        mine(db, "default", settle_s=2.0)
        flags = select(func.count()).select_from(CompletionFlag)
        flagged = db.scalar(flags.where(CompletionFlag.project_id == "default", CompletionFlag.mode == "truncated"))
    eng.dispose()
    browser.get(f"{w.proxy.url}/ui#/traffic?mined=truncated")
    _wait(browser, "traffic")
    assert int(_shown(browser, "matching")) == flagged > 0
    # The other project's key sees its own call only.
    _open(browser, w, w.other)
    assert int(_shown(browser, "calls")) == 1
    assert w.hostile_call not in browser.page_source
    _open(browser, w, w.admin, "health")
    health = w.get("/v1/ui/health")
    assert _shown(browser, "dropped") == "0" and health["records"]["dropped"] == 0
    assert health["records"]["spooled"] >= len(calls) > 0  # the spool's own count, /metrics read or not
    assert w.get("/v1/ui/health", w.harness)["records"] is None  # every project's traffic: the operator's only
    assert int(_shown(browser, "spool-depth")) == httpx.get(f"{w.proxy.url}/readyz").json()["spool"]["depth"]
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", "[data-k='alerts-open']"))
    assert int(_shown(browser, "alerts-open")) == len(w.get("/v1/admin/alerts")["data"])
    browser.save_screenshot(str(SHOTS / "health.png"))
    _open(browser, w, w.admin, "learning")
    assert _errors(browser) == [] and browser.find_elements("css selector", "svg.chart path.line")
    browser.save_screenshot(str(SHOTS / "learning.png"))


def _nothing_ran(driver: Any) -> None:
    assert driver.execute_script("return window.__pwned") is None
    assert driver.find_elements("css selector", "#view img, #view script") == []
    assert driver.execute_script("return window.__violations") == []


def test_traffic_to_session_to_tokens_and_nothing_recorded_runs(world: World, browser: Any) -> None:
    w = world
    resp = httpx.get(f"{w.proxy.url}/ui")
    assert "script-src 'self'" in resp.headers["content-security-policy"] and "unsafe" not in resp.text
    _open(browser, w, w.harness)
    # A CSP violation would mean markup from the data reached the DOM as markup: count them from here on.
    browser.execute_script(
        "window.__violations = []; document.addEventListener('securitypolicyviolation',"
        " (e) => window.__violations.push(e.violatedDirective))"
    )
    _goto(browser, f"session/{w.session}", "session")
    session = w.get(f"/v1/sessions/{w.session}", w.harness)
    turns = browser.find_elements("css selector", "section.turn")
    assert len(turns) == len(session["completions"]) == 2
    text = browser.find_element("id", "view").text
    assert f"Plan a trip. {HOSTILE}" in text and f"wrong station {HOSTILE}" in text
    assert "Trains leave at 9." in text and "search" in text  # the tool call and its result
    assert browser.find_elements("css selector", "li.superseded")  # the reward's first revision
    _nothing_ran(browser)
    browser.save_screenshot(str(SHOTS / "session.png"))
    _goto(browser, f"call/{w.hostile_call}", "call")
    record = w.get(f"/v1/chat/completions/{w.hostile_call}", w.harness)["onthejob"]
    chips = browser.find_elements("css selector", "#sampled .tok")
    assert [int(c.get_attribute("data-id")) for c in chips] == record["completion_token_ids"][0]
    assert [float(c.get_attribute("data-lp")) for c in chips] == record["logprobs"][0]
    assert int(_shown(browser, "sampled")) == len(record["completion_token_ids"][0])
    trajectory = browser.find_elements("css selector", "#trajectory .tok")
    assert len(trajectory) > len(chips) and browser.find_elements("css selector", "#trajectory .tok.gap")
    browser.find_element("id", "decode").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_elements("css selector", ".span-text"))
    assert "Plan a trip." in browser.find_element("css selector", ".decoded").text
    _nothing_ran(browser)
    browser.save_screenshot(str(SHOTS / "tokens.png"))


def _rollback(driver: Any, w: World) -> str:
    driver.find_element("css selector", "#deploy-form input[name=alias]").send_keys(w.model)
    driver.find_element("id", "rollback").click()
    WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert)
    driver.switch_to.alert.accept()
    WebDriverWait(driver, 60).until(lambda d: "working" not in d.find_element("id", "action-result").text)
    return str(driver.find_element("id", "action-result").text)


def test_admin_action_refused_for_a_harness_key_done_for_an_admin_key(world: World, browser: Any) -> None:
    w = world
    before = w.get("/v1/admin/deployments")["data"]
    _open(browser, w, w.harness, "control")
    assert "refused: 403" in _rollback(browser, w)
    assert w.get("/v1/admin/deployments")["data"] == before
    _open(browser, w, w.admin, "control")
    assert "done:" in _rollback(browser, w)
    after = w.get("/v1/admin/deployments")["data"]
    assert len(after) == len(before) + 1 and after[-1]["version"] is None and after[-1]["alias"] == w.model
    browser.save_screenshot(str(SHOTS / "control.png"))


def _confirm(driver: Any, result_id: str) -> str:
    """Accept the page's confirmation dialog; what the action's result area then says."""
    WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert)
    driver.switch_to.alert.accept()
    WebDriverWait(driver, 60).until(lambda d: "working" not in d.find_element("id", result_id).text)
    return str(driver.find_element("id", result_id).text)


def _publish_from_dataset(w: World, engine: Engine, folder: Path, alias: str, dataset: str) -> None:
    """v1 of ``alias``, published by a run that trained from ``dataset`` (as `onthejob train --dataset` records)."""
    eng = sync_engine(w.proxy.db_url)
    with Session(eng) as db:
        run = TrainingRun(
            project_id="default",
            alias=alias,
            objective="reinforce",
            base_model=w.model,
            config={"dataset": dataset},
            status="finished",
        )
        db.add(run)
        db.flush()
        db.add(TrainingStep(run_id=run.id, step=1, adapter_version=1, metrics={"loss": 0.5}))
        record_adapter(
            db,
            project_id="default",
            alias=alias,
            version=1,
            parent_version=None,
            run_id=run.id,
            path=light_adapter(engine.model, folder),
            base=engine.model,
            metrics={},
        )
        db.commit()
    eng.dispose()


def test_promotion_datasets_and_lineage_shown_as_the_api_says(
    world: World, browser: Any, tiny_engine: Engine, tmp_path: Path
) -> None:
    w, alias = world, "ui-helper"
    w.send("POST", "/v1/admin/aliases", {"name": alias, "base_model": w.model})
    _publish_from_dataset(w, tiny_engine, tmp_path / "v1", alias, "ui-set")
    # The gate policy is set in the page (admin, confirmed); then v1 is a candidate, worse than the base on its eval.
    _open(browser, w, w.admin, "control")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", "#policy-form"))
    Select(browser.find_element("css selector", "#policy-form select[name=alias]")).select_by_value(alias)
    Select(browser.find_element("css selector", "#policy-form select[name=mode]")).select_by_value("gate")
    browser.find_element("css selector", "#policy-form button").click()
    assert "done:" in _confirm(browser, "policy-result")
    assert w.get(f"/v1/admin/aliases/{alias}/policy")["mode"] == "gate"
    browser.find_element("css selector", "#retention-form input").send_keys("3650")
    browser.find_element("css selector", "#retention-form button").click()
    assert "done:" in _confirm(browser, "retention-result")
    assert w.get("/v1/admin/project")["settings"]["retention_days"] == 3650
    candidate = w.send("POST", "/v1/admin/deployments", {"alias": alias, "version": 1, "candidate": True})
    assert candidate["status"] == "pending"
    items = {f"q{i}": float(i % 3) / 2 for i in range(9)}
    for version, shift in (("base", 0.0), ("1", 0.3)):  # means 0.5 and 0.2: no tie for toFixed(3) to round
        scores = {k: v - shift for k, v in items.items()}
        body = {"name": "heldout", "n": 9, "mean": sum(scores.values()) / 9, "stderr": 0.05, "scores": scores}
        decided = w.send("POST", f"/v1/admin/aliases/{alias}/versions/{version}/evals", body)["decision"]
    assert decided == "held"
    # An admin creates a dataset of every trajectory in the page (confirmed); its items are the API's.
    browser.find_element("css selector", "#nav a[href='#/datasets']").click()
    _wait(browser, "datasets")
    browser.find_element("css selector", "#dataset-form input[name=name]").send_keys("ui-set")
    browser.find_element("css selector", "#dataset-form button").click()
    assert "done:" in _confirm(browser, "dataset-result")
    _goto(browser, "dataset/ui-set", "dataset")
    shown = w.get("/v1/admin/datasets/ui-set")
    assert int(_shown(browser, "ds-trajectories")) == shown["counts"]["trajectories"] == len(shown["items"]) > 0
    rewards = [e.get_attribute("data-reward") for e in browser.find_elements("css selector", "#items span.reward")]
    assert [None if r == "null" else float(r) for r in rewards] == [i["reward"] for i in shown["items"]]

    # A harness key reads all of it: the held decision on the chart and in the table, the evals as posted.
    _open(browser, w, w.harness, "learning")
    assert _errors(browser) == [] and browser.find_elements("css selector", "#reward-chart g.marker.promo-held")
    part = browser.find_element("css selector", f".alias-promotions[data-alias='{alias}']")
    newest = part.find_elements("css selector", "table.decisions tbody tr")[0].find_elements("css selector", "td")
    decision = w.get(f"/v1/admin/aliases/{alias}/promotions")["data"][-1]
    assert [newest[1].text, newest[4].text] == ["v1", "held"]
    assert (decision["version"], decision["decision"]) == (1, "held")
    for version in ("base", "1"):
        evals = w.get(f"/v1/admin/aliases/{alias}/versions/{version}/evals")["data"]
        api = [(e["name"], e["n"], e["mean"], e["stderr"]) for e in evals]
        rows = part.find_elements("css selector", f"li.eval[data-version='{version}']")
        page = [
            (
                e.get_attribute("data-name"),
                int(e.get_attribute("data-n")),
                float(e.get_attribute("data-mean")),
                float(e.get_attribute("data-stderr")),
            )
            for e in rows
        ]
        assert page == api and len(api) == 1
        assert f"{api[0][2]:.3f} ± {api[0][3]:.3f}" in part.text
    browser.execute_script("arguments[0].scrollIntoView()", part)
    browser.save_screenshot(str(SHOTS / "promotions.png"))
    # From the version to its lineage, to the dataset it trained from: read-only for this key.
    _goto(browser, f"lineage/{alias}/1", "lineage")
    assert "ui-set" in browser.find_element("id", "lineage").text
    _goto(browser, "dataset/ui-set", "dataset")
    assert int(_shown(browser, "ds-trajectories")) == shown["counts"]["trajectories"]
    assert browser.find_elements("css selector", f"#view a[href='#/lineage/{alias}/1']")
    browser.find_element("css selector", "#nav a[href='#/datasets']").click()
    _wait(browser, "datasets")
    browser.find_element("css selector", "#dataset-form input[name=name]").send_keys("ui-set-2")
    browser.find_element("css selector", "#dataset-form button").click()
    assert "refused: 403" in _confirm(browser, "dataset-result")
    assert [d["name"] for d in w.get("/v1/admin/datasets")["data"]] == ["ui-set"]
    browser.save_screenshot(str(SHOTS / "datasets.png"))
    # An admin deletes a session from its page (confirmed): the API no longer has it.
    _chat(w, w.harness, "ui-doomed", [{"role": "user", "content": "forget me"}])
    w.proxy.wait_drained()
    _open(browser, w, w.admin, "session/ui-doomed")
    browser.find_element("id", "delete-session").click()
    assert "done: deleted 1 calls" in _confirm(browser, "delete-result")
    gone = httpx.get(f"{w.proxy.v1}/sessions/ui-doomed", headers={"authorization": f"Bearer {w.admin}"}, timeout=30)
    assert gone.status_code == 404
