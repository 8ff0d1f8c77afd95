"""Saving, recording and deploying adapters: versions, hashes, paths, and clear deploy errors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.weights import ModelInfo
from storage.db import sync_engine
from storage.keys import ensure_project
from storage.models import Adapter
from trainer.errors import DeployError, PublishError
from trainer.policy import TrainConfig, load_policy
from trainer.publish import adapter_dir, content_sha256, deploy, next_version, publish, save_adapter


@pytest.fixture(scope="module")
def model() -> object:
    return load_policy(TrainConfig(model="tiny", threads=1)).model


@pytest.fixture
def db(pg_url: str) -> Session:
    engine = sync_engine(pg_url)
    with Session(engine) as session:
        yield session  # type: ignore[misc]
    engine.dispose()


def test_adapter_dir_is_absolute_and_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    expected = tmp_path / "adapters" / "acme" / "support-agent" / "v3"
    assert adapter_dir("adapters", "acme", "support-agent", 3) == expected
    assert adapter_dir("adapters", "acme", "a/../b", 1).parent.name == "a%2F..%2Fb"
    # Two projects with the same alias on one shared volume never share a folder.
    assert adapter_dir("adapters", "acme", "helper", 1) != adapter_dir("adapters", "globex", "helper", 1)
    assert adapter_dir("adapters", "acme", "..", 1).parent == tmp_path / "adapters" / "acme" / "%2E."
    assert adapter_dir("adapters", "..", "helper", 1).parents[1] == tmp_path / "adapters" / "%2E."
    with pytest.raises(PublishError, match="empty"):
        adapter_dir("adapters", "acme", "", 1)


def test_save_is_atomic_and_never_overwrites(model: object, tmp_path: Path) -> None:
    folder = save_adapter(model, adapter_dir(tmp_path, "p", "a", 1))
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert [p.name for p in folder.parent.iterdir()] == ["v1"]  # no staging folder left behind
    with pytest.raises(PublishError, match="never overwritten"):
        save_adapter(model, folder)


def test_content_hash_ignores_config_key_order(model: object, tmp_path: Path) -> None:
    folder = save_adapter(model, tmp_path / "x")
    digest = content_sha256(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["target_modules"] = list(reversed(config["target_modules"]))
    (folder / "adapter_config.json").write_text(json.dumps(dict(reversed(list(config.items())))))
    assert content_sha256(folder) == digest
    (folder / "adapter_model.safetensors").write_bytes(b"changed")
    assert content_sha256(folder) != digest


def test_publish_numbers_versions_and_records_lineage(model: object, db: Session, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ensure_project(db, project)
    db.commit()
    base = ModelInfo(path=tmp_path, name="tiny-qwen2", sha256="b" * 64)
    assert next_version(db, project, "helper") == 1
    first = publish(
        db,
        model,
        root=tmp_path / "adapters",
        project_id=project,
        alias="helper",
        parent_version=None,
        base=base,
        run_id=None,
        metrics={"loss": 0.5, "kl": float("nan")},
    )
    second = publish(
        db,
        model,
        root=tmp_path / "adapters",
        project_id=project,
        alias="helper",
        parent_version=1,
        base=base,
        run_id=None,
        metrics={},
    )
    rows = db.scalars(select(Adapter).where(Adapter.project_id == project).order_by(Adapter.version)).all()
    assert [(r.version, r.parent_version) for r in rows] == [(1, None), (2, 1)]
    assert first.path == str((tmp_path / "adapters" / project / "helper" / "v1").resolve())
    assert Path(second.path).is_absolute() and Path(second.path).is_dir()
    assert first.sha256 == content_sha256(Path(first.path))
    assert (first.base_model, first.base_sha256) == ("tiny-qwen2", "b" * 64)
    assert first.metrics == {"loss": 0.5, "kl": None}  # NaN is not JSON


def test_publish_never_replaces_a_folder_it_finds(model: object, db: Session, tmp_path: Path) -> None:
    project = f"p-{uuid.uuid4().hex[:8]}"
    ensure_project(db, project)
    db.commit()
    orphan = adapter_dir(tmp_path, project, "helper", 1)
    orphan.mkdir(parents=True)
    (orphan / "junk").write_text("left by a crash before the row was committed")
    base = ModelInfo(path=tmp_path, name="tiny-qwen2", sha256="b" * 64)
    row = publish(
        db,
        model,
        root=tmp_path,
        project_id=project,
        alias="helper",
        parent_version=None,
        base=base,
        run_id=None,
        metrics={},
    )
    assert row.version == 1 and Path(row.path) == orphan.parent / f"v1~{row.id}"
    assert (orphan / "junk").is_file() and row.sha256 == content_sha256(Path(row.path))


def _client(status: int, body: dict[str, object], seen: list[httpx.Request]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_deploy_posts_alias_and_version_with_the_admin_key() -> None:
    seen: list[httpx.Request] = []
    out = deploy(
        "http://proxy:8000/",
        "helper",
        3,
        "otj-secret",
        client=_client(201, {"alias": "helper", "version": 3, "status": "active"}, seen),
    )
    assert out["status"] == "active"
    (request,) = seen
    assert str(request.url) == "http://proxy:8000/v1/admin/deployments"
    assert json.loads(request.content) == {"alias": "helper", "version": 3}
    assert request.headers["authorization"] == "Bearer otj-secret"


def test_deploy_failure_names_the_cause() -> None:
    body = {"error": {"message": "engine http://e1 refused the adapter", "type": "upstream_error"}}
    with pytest.raises(DeployError, match=r"HTTP 502 engine http://e1 refused the adapter"):
        deploy("http://proxy", "helper", 3, "k", client=_client(502, body, []))
    with pytest.raises(DeployError, match="--admin-key"):
        deploy("http://proxy", "helper", 3, None, client=_client(401, {"error": {"message": "no key"}}, []))


def test_deploy_to_an_unreachable_proxy() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    with pytest.raises(DeployError, match="cannot reach the proxy"):
        deploy("http://proxy", "helper", 3, "k", client=client)
