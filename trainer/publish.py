"""Publish a trained adapter: save it where engines can read it, record it, ask the proxy to deploy it.

Order matters. The version number comes from the database (previous max + 1,
and a unique constraint settles a race between two trainers). The directory is
written under a temporary name and renamed into place, so an engine never
reads half an adapter, and a version's directory is never overwritten: vLLM
caches adapters by name, so ``alias@vN`` must always mean the same weights.
Only after the row is committed do we call the proxy, which loads the adapter
into every engine, verifies it and switches routing. The trainer never talks
to engines itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from engine.weights import ModelInfo
from storage.models import Adapter
from trainer.errors import DeployError, PublishError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _folder_name(kind: str, name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if safe in ("", ".", ".."):
        raise PublishError(f"{kind} {name!r} cannot name a folder; use letters, digits, '.', '_' or '-'")
    return safe


def adapter_dir(root: Path | str, project_id: str, alias: str, version: int) -> Path:
    """``ROOT/<project>/<alias>/v<N>`` as an absolute path (engines resolve it in their own working directory).

    The project is part of the path: two projects may both have an alias ``support`` and share
    one adapter volume, and neither may ever overwrite the other's versions.
    """
    project = _folder_name("project", project_id)
    return Path(root).expanduser().resolve() / project / _folder_name("alias", alias) / f"v{version}"


def content_sha256(folder: Path) -> str:
    """Hash of the adapter's weights and canonical config (PEFT writes ``target_modules`` in set order)."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        path = folder / name
        if not path.is_file():
            raise PublishError(f"{folder} has no {name}: not a PEFT adapter directory")
        digest.update(name.encode())
        if name.endswith(".json"):
            config = json.loads(path.read_text())
            if isinstance(config.get("target_modules"), list):
                config["target_modules"] = sorted(config["target_modules"])
            digest.update(json.dumps(config, sort_keys=True).encode())
        else:
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def next_version(db: Session, project_id: str, alias: str) -> int:
    """Previous max version of the alias + 1 (1 for the first adapter)."""
    current = db.scalar(
        select(func.max(Adapter.version)).where(Adapter.project_id == project_id, Adapter.alias == alias)
    )
    return int(current or 0) + 1


def save_adapter(model: Any, folder: Path, optimizer: Any = None) -> Path:
    """Write the PEFT adapter (and the optimiser state) to ``folder`` atomically; never overwrite a version."""
    if folder.exists():
        raise PublishError(f"{folder} already exists; adapter versions are never overwritten")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model.save_pretrained(str(staging))
        if optimizer is not None:
            from trainer.checkpoint import save_optimizer

            save_optimizer(optimizer, staging)
        staging.chmod(0o755)  # mkdtemp makes it 0700; engines may run as another user
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def record_adapter(
    db: Session,
    *,
    project_id: str,
    alias: str,
    version: int,
    parent_version: int | None,
    path: Path,
    base: ModelInfo,
    run_id: int | None,
    metrics: dict[str, Any],
) -> Adapter:
    """Insert the ``Adapter`` row (flushed, not committed)."""
    row = Adapter(
        project_id=project_id, alias=alias, version=version, parent_version=parent_version,
        path=str(path), sha256=content_sha256(path), base_model=base.name, base_sha256=base.sha256,
        training_run_id=run_id, metrics=jsonable(metrics),
    )  # fmt: skip
    db.add(row)
    try:
        db.flush()
    except IntegrityError as exc:
        db.rollback()
        raise PublishError(f"{alias}@v{version} was recorded by someone else meanwhile; retry the step") from exc
    return row


def publish(
    db: Session,
    model: Any,
    *,
    root: Path | str,
    project_id: str,
    alias: str,
    parent_version: int | None,
    base: ModelInfo,
    run_id: int | None,
    metrics: dict[str, Any],
    optimizer: Any = None,
) -> Adapter:
    """Save the next version of ``alias`` (with its optimiser state, if given) and commit its row."""
    version = next_version(db, project_id, alias)
    folder = adapter_dir(root, project_id, alias, version)
    if folder.exists():
        # Left by a publish that crashed before its row was committed: no row means
        # no engine was ever asked to load it, so replacing it cannot serve stale weights.
        shutil.rmtree(folder)
    save_adapter(model, folder, optimizer)
    try:
        row = record_adapter(
            db, project_id=project_id, alias=alias, version=version, parent_version=parent_version,
            path=folder, base=base, run_id=run_id, metrics=metrics,
        )  # fmt: skip
        db.commit()
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return row


def deploy(
    proxy: str,
    alias: str,
    version: int | None,
    admin_key: str | None,
    *,
    client: httpx.Client | None = None,
    timeout: float = 120.0,
    candidate: bool = False,
) -> dict[str, Any]:
    """POST ``/v1/admin/deployments``; raise :class:`DeployError` with the proxy's own message on failure.

    ``candidate``: the alias's promotion policy decides (auto routes it now; gate and canary hold it).
    """
    url = f"{proxy.rstrip('/')}/v1/admin/deployments"
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    own = client is None
    http = client or httpx.Client(timeout=timeout)
    try:
        body: dict[str, Any] = {"alias": alias, "version": version}
        if candidate:
            body["candidate"] = True
        resp = http.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise DeployError(f"cannot reach the proxy at {proxy} to deploy {alias}@v{version}: {exc}") from exc
    finally:
        if own:
            http.close()
    if resp.status_code >= 400:
        hint = " (pass --admin-key or set ONTHEJOB_ADMIN_KEY)" if resp.status_code in (401, 403) else ""
        raise DeployError(f"proxy refused to deploy {alias}@v{version}: HTTP {resp.status_code} {_message(resp)}{hint}")
    try:
        body = resp.json()
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {"response": body}


def _message(resp: httpx.Response) -> str:
    """The OpenAI-style error message if there is one, else the raw text (shortened)."""
    try:
        err = resp.json().get("error", {})
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return resp.text[:300]


def jsonable(value: Any) -> Any:
    """Metrics with NaN/inf replaced by None (JSON columns refuse them on Postgres)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
