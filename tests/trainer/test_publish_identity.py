"""Adapter identity: a version is reserved by its row before its folder is placed; folders are named by a
reversible escape; no publish deletes or overwrites a folder a row names (issue 33), on Postgres and SQLite."""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from engine.weights import ModelInfo
from storage.admin import list_adapters
from storage.db import async_engine, sync_engine
from storage.keys import ensure_project
from storage.lineage import version_lineage
from storage.migrate import upgrade
from storage.models import Adapter
from storage.models.training import ADAPTER_COMMITTED, ADAPTER_RESERVED
from trainer import publish as publish_module
from trainer import run_rows
from trainer.errors import PublishError
from trainer.policy import TrainConfig, load_policy
from trainer.publish import (
    MAX_NAME,
    adapter_dir,
    content_sha256,
    folder_name,
    publish,
    record_adapter,
    save_adapter,
)
from trainer.settings import TrainSettings

BASE = ModelInfo(path=Path("."), name="tiny-qwen2", sha256="b" * 64)


@pytest.fixture(scope="module")
def models() -> list[Any]:
    """Two real tiny PEFT models with different LoRA weights (so whose weights a folder holds is checkable)."""
    first = load_policy(TrainConfig(model="tiny", threads=1)).model
    out = []
    for seed in (1, 2):
        model = copy.deepcopy(first)
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
        out.append(model)
    return out


@pytest.fixture(scope="module")
def shas(models: list[Any], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("shas")
    return [content_sha256(save_adapter(m, root / str(i))) for i, m in enumerate(models)]


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    url = f"sqlite:///{tmp_path / 'adapters.db'}"
    upgrade(url)
    return url


@pytest.fixture
def project(url: str) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    eng = sync_engine(url)
    with Session(eng) as db:
        ensure_project(db, name)
        db.commit()
    eng.dispose()
    return name


@pytest.fixture
def db(url: str) -> Iterator[Session]:
    eng = sync_engine(url)
    with Session(eng) as session:
        yield session
    eng.dispose()


def _publish(db: Session, model: Any, root: Path, project: str, alias: str) -> Adapter:
    return publish(
        db, model, root=root, project_id=project, alias=alias, parent_version=None, base=BASE, run_id=None, metrics={}
    )


def _rows(db: Session, project: str) -> list[Adapter]:
    db.expire_all()
    return list(db.scalars(select(Adapter).where(Adapter.project_id == project).order_by(Adapter.id)))


def _intact(row: Adapter) -> bool:
    return row.state == ADAPTER_COMMITTED and content_sha256(Path(row.path)) == row.sha256


class Meeting:
    """A model whose save waits until the other trainer is saving too: both publishes are in flight at once."""

    def __init__(self, model: Any, barrier: threading.Barrier) -> None:
        self.model, self.barrier = model, barrier

    def save_pretrained(self, path: str) -> None:
        self.barrier.wait(timeout=120)  # a guard against a hang, not a synchronisation by time
        self.model.save_pretrained(path)


def test_two_trainers_on_one_alias_get_intact_versions(
    url: str, project: str, models: list[Any], shas: list[str], tmp_path: Path
) -> None:
    rounds, barrier = 3, threading.Barrier(2)
    errors: list[BaseException] = []

    def trainer(model: Any) -> None:
        eng = sync_engine(url)
        try:
            with Session(eng) as db:
                for _ in range(rounds):
                    _publish(db, Meeting(model, barrier), tmp_path, project, "shared")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            barrier.abort()
            errors.append(exc)
        finally:
            eng.dispose()

    threads = [threading.Thread(target=trainer, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    eng = sync_engine(url)
    with Session(eng) as db:
        rows = _rows(db, project)
    eng.dispose()
    assert sorted(r.version for r in rows) == list(range(1, 2 * rounds + 1))
    assert all(_intact(r) for r in rows)
    assert sorted(r.sha256 for r in rows) == sorted(shas * rounds)  # each trainer's weights, rounds times each
    assert len({r.path for r in rows}) == 2 * rounds
    assert not [p for p in (tmp_path / folder_name(project) / "shared").iterdir() if p.name.startswith(".")]


def test_a_lost_race_for_a_version_takes_the_next(
    url: str, project: str, models: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both trainers read the same max before either inserts: the unique key refuses one, which retries."""
    barrier, first, reads = threading.Barrier(2), threading.local(), []
    real = publish_module.next_version

    def racing(db: Session, project_id: str, alias: str) -> int:
        version = real(db, project_id, alias)
        reads.append(version)
        if not getattr(first, "done", False):
            first.done = True
            barrier.wait(timeout=120)
        return version

    monkeypatch.setattr(publish_module, "next_version", racing)
    errors: list[BaseException] = []

    def trainer(model: Any) -> None:
        eng = sync_engine(url)
        try:
            with Session(eng) as db:
                _publish(db, model, tmp_path, project, "shared")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            barrier.abort()
            errors.append(exc)
        finally:
            eng.dispose()

    threads = [threading.Thread(target=trainer, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(reads) == [1, 1, 2]
    eng = sync_engine(url)
    with Session(eng) as db:
        rows = _rows(db, project)
    eng.dispose()
    assert sorted(r.version for r in rows) == [1, 2] and all(_intact(r) for r in rows)


def test_lossy_names_get_their_own_folders(
    db: Session, project: str, models: list[Any], shas: list[str], tmp_path: Path
) -> None:
    colon = _publish(db, models[0], tmp_path, project, "a:b")
    under = _publish(db, models[1], tmp_path, project, "a_b")
    assert Path(colon.path).parent.name == "a%3Ab" and Path(under.path).parent.name == "a_b"
    rows = _rows(db, project)
    assert [r.sha256 for r in rows] == shas and all(_intact(r) for r in rows)


def test_a_folder_found_in_place_is_never_replaced(
    db: Session, project: str, models: list[Any], shas: list[str], tmp_path: Path
) -> None:
    """A row written under the old lossy names (``a:b`` at ``a_b/v1``) keeps its folder; ``a_b@v1`` goes beside."""
    legacy = save_adapter(models[0], tmp_path / folder_name(project) / "a_b" / "v1")
    record_adapter(
        db,
        project_id=project,
        alias="a:b",
        version=1,
        parent_version=None,
        path=legacy,
        base=BASE,
        run_id=None,
        metrics={},
    )
    db.commit()
    orphan = adapter_dir(tmp_path, project, "a_b", 2)  # no row names it: a crash of the old order, say
    orphan.mkdir()
    (orphan / "junk").write_text("not ours to delete")
    first = _publish(db, models[1], tmp_path, project, "a_b")
    assert first.version == 1 and Path(first.path).name == f"v1~{first.id}"
    second = _publish(db, models[1], tmp_path, project, "a_b")
    assert second.version == 2 and Path(second.path).name == f"v2~{second.id}"
    assert (orphan / "junk").read_text() == "not ours to delete"
    rows = _rows(db, project)
    assert [r.sha256 for r in rows] == [shas[0], shas[1], shas[1]] and all(_intact(r) for r in rows)
    assert rows[0].path == str(legacy)  # rows keep the path they were written to


def test_a_reserved_version_keeps_its_number_and_is_read_by_nobody(
    url: str, db: Session, project: str, models: list[Any], shas: list[str], tmp_path: Path
) -> None:
    """A publish that crashed after reserving v2: the next is v3, and no reader takes v2 for a version."""
    _publish(db, models[0], tmp_path, project, "agent")
    crashed = adapter_dir(tmp_path, project, "agent", 2)
    db.add(
        Adapter(
            project_id=project,
            alias="agent",
            version=2,
            path=str(crashed),
            sha256=shas[1],
            base_model=BASE.name,
            state=ADAPTER_RESERVED,
            parent_version=1,
        )
    )
    db.commit()
    save_adapter(models[1], crashed)  # it got as far as renaming its folder into place
    row = _publish(db, models[0], tmp_path, project, "agent")
    assert row.version == 3 and content_sha256(crashed) == shas[1]
    db.delete(row)  # readers ignore v2 whether or not a later version exists
    db.commit()
    settings = TrainSettings(alias="agent", database_url="sqlite://", project=project)
    assert run_rows.resume_point(db, settings)[0] == 1
    assert run_rows.adapter_row(db, settings, 2) is None
    assert set(run_rows.adapter_paths(db, settings)) == {1}
    assert version_lineage(db, project, "agent", 2) is None
    assert asyncio.run(_listed(url, project)) == [1]  # GET /v1/admin/adapters


async def _listed(url: str, project: str) -> list[int]:
    eng = async_engine(url)
    try:
        async with AsyncSession(eng) as db:
            return [row.version for row in await list_adapters(db, project, "agent")]
    finally:
        await eng.dispose()


def test_a_failed_save_leaves_no_row_and_no_folder(db: Session, project: str, tmp_path: Path) -> None:
    class Broken:
        def save_pretrained(self, path: str) -> None:
            (Path(path) / "adapter_config.json").write_text("{}")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _publish(db, Broken(), tmp_path, project, "agent")
    db.rollback()
    assert _rows(db, project) == []
    assert list((tmp_path / folder_name(project) / "agent").iterdir()) == []


NAMES = [
    "a:b",
    "a_b",
    "a%3Ab",
    "a b",
    "a/b",
    "a\\b",
    ".",
    "..",
    ".hidden",
    "%",
    "~",
    "ü",
    "Ü",
    "日本",
    "support-agent",
    "v1.2_x",
]


def test_folder_names_are_reversible_and_distinct() -> None:
    folders = [folder_name(n) for n in NAMES]
    assert [unquote(f) for f in folders] == NAMES
    assert len(set(folders)) == len(NAMES)
    assert folder_name("a_b") == "a_b" and folder_name("a:b") == "a%3Ab" and folder_name("..") == "%2E."
    assert all(not f.startswith(".") and "/" not in f for f in folders)  # staging folders are the hidden ones
    with pytest.raises(PublishError, match="empty"):
        folder_name("")


def test_long_names_stay_distinct_within_the_limit() -> None:
    longs = ["x" * 300, "x" * 299 + "y", "日" * 200, "日" * 199 + "本", "x" * 166 + ":" * 12]
    folders = [folder_name(n) for n in longs]
    assert len(set(folders)) == len(longs) and all(len(f) <= MAX_NAME and "~" in f for f in folders)
    assert all("%" not in f.rsplit("~", 1)[0][-2:] for f in folders)  # never cut inside an escape
