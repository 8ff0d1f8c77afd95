"""Publish a trained adapter: save it where engines can read it, record it, ask the proxy to deploy it.

Order matters, and no step ever deletes or overwrites a folder some row names:

1. The adapter is written to a hidden staging folder beside its alias's versions and hashed.
2. Its version is reserved: the row is inserted ``reserved`` (previous max + 1; the unique key
   settles a race between two trainers, and the loser takes the next number) and committed.
3. The version's folder is claimed (``mkdir`` fails if anything is there) and the staging folder
   renamed onto the claim, so an engine never reads half an adapter and a folder found in place
   (another alias's under the old lossy names, say) is left alone: the version goes beside it.
4. The row is marked ``committed``: only then may it be listed, deployed or trained from.

A crash leaves a staging folder no row names, or a reserved row whose number is never reused
(vLLM caches adapters by name, so ``alias@vN`` must always mean the same weights). Folder names
are a reversible escape of project and alias (``folder_name``), so two names never share a folder.
Only after the row is committed do we call the proxy, which loads the adapter into every engine,
verifies it and switches routing. The trainer never talks to engines itself.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from engine.weights import ModelInfo
from storage.models import Adapter
from storage.models.training import ADAPTER_COMMITTED, ADAPTER_RESERVED
from trainer.errors import DeployError, PublishError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SAFE = frozenset(string.ascii_letters + string.digits + "._-")
MAX_NAME = 200  # characters of one folder name (file systems allow 255 bytes)
RESERVE_TRIES = 50  # each lost race means another trainer won a version; 50 at once is far past any deployment
STAGING = ".staging-"  # escaped names never start with "."


def folder_name(name: str) -> str:
    """``name`` as one folder name, reversibly: every byte outside ``[A-Za-z0-9._-]`` (and a leading ``.``)
    percent-encoded, so ``a:b`` is ``a%3Ab`` and ``a_b`` stays ``a_b``; ``urllib.parse.unquote`` gives it back.

    A name whose escape is longer than ``MAX_NAME`` keeps a prefix and adds ``~`` and a hash of the whole
    name (``~`` is never part of an escape): still one folder per name, found again through the row's path.
    """
    if not name:
        raise PublishError("an empty name cannot name a folder")
    escaped = "".join(ch if ch in SAFE else "".join(f"%{b:02X}" for b in ch.encode()) for ch in name)
    if escaped.startswith("."):  # hidden names are the staging folders'; "." and ".." name no folder of ours
        escaped = "%2E" + escaped[1:]
    if len(escaped) <= MAX_NAME:
        return escaped
    prefix = escaped[: MAX_NAME - 33]
    cut = prefix.rfind("%", len(prefix) - 2)  # never end inside an escape
    return f"{prefix[:cut] if cut >= 0 else prefix}~{hashlib.sha256(name.encode()).hexdigest()[:32]}"


def adapter_dir(root: Path | str, project_id: str, alias: str, version: int) -> Path:
    """``ROOT/<project>/<alias>/v<N>`` as an absolute path (engines resolve it in their own working directory).

    The project is part of the path: two projects may both have an alias ``support`` and share
    one adapter volume, and neither may ever overwrite the other's versions. This is where a new
    version goes; a recorded version is wherever its row's ``path`` says.
    """
    return Path(root).expanduser().resolve() / folder_name(project_id) / folder_name(alias) / f"v{version}"


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
    """Previous max version of the alias + 1 (1 for the first adapter); reserved versions count."""
    current = db.scalar(
        select(func.max(Adapter.version)).where(Adapter.project_id == project_id, Adapter.alias == alias)
    )
    return int(current or 0) + 1


def _stage(model: Any, home: Path, optimizer: Any) -> Path:
    """Write the PEFT adapter (and the optimiser state) to a new hidden folder in ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=home))
    try:
        model.save_pretrained(str(staging))
        if optimizer is not None:
            from trainer.checkpoint import save_optimizer

            save_optimizer(optimizer, staging)
        staging.chmod(0o755)  # mkdtemp makes it 0700; engines may run as another user
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _place(staging: Path, folder: Path) -> bool:
    """Rename ``staging`` to ``folder`` unless something is there already; never replaces what it finds.

    ``mkdir`` claims the name atomically (two writers cannot both get it); the rename then
    replaces only the empty folder just made.
    """
    try:
        folder.mkdir()
    except FileExistsError:
        return False
    staging.rename(folder)
    return True


def save_adapter(model: Any, folder: Path, optimizer: Any = None) -> Path:
    """Write the PEFT adapter (and the optimiser state) to ``folder`` atomically; never overwrite a version."""
    staging = _stage(model, folder.parent, optimizer)
    if not _place(staging, folder):
        shutil.rmtree(staging, ignore_errors=True)
        raise PublishError(f"{folder} already exists; adapter versions are never overwritten")
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
    """Insert the committed ``Adapter`` row of a folder already in place (flushed, not committed)."""
    row = Adapter(
        project_id=project_id,
        alias=alias,
        version=version,
        parent_version=parent_version,
        path=str(path),
        sha256=content_sha256(path),
        base_model=base.name,
        base_sha256=base.sha256,
        training_run_id=run_id,
        metrics=jsonable(metrics),
    )
    db.add(row)
    try:
        db.flush()
    except IntegrityError as exc:
        db.rollback()
        raise PublishError(f"{alias}@v{version} was recorded by someone else meanwhile; retry the step") from exc
    return row


def reserve(db: Session, root: Path | str, *, project_id: str, alias: str, **fields: Any) -> Adapter:
    """Insert and commit the next version's row as ``reserved`` (its folder named, not yet in place).

    Two trainers may read the same max; the unique key refuses the second insert, which rolls back
    and takes the next number. The session's pending changes are committed (or rolled back) with it.
    """
    for _ in range(RESERVE_TRIES):
        version = next_version(db, project_id, alias)
        row = Adapter(
            project_id=project_id,
            alias=alias,
            version=version,
            state=ADAPTER_RESERVED,
            path=str(adapter_dir(root, project_id, alias, version)),
            **fields,
        )
        db.add(row)
        try:
            db.commit()
        except IntegrityError:
            db.rollback()
            continue
        return row
    raise PublishError(f"could not reserve a version of {alias!r}: {RESERVE_TRIES} other publishes won first")


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
    """Save the next version of ``alias`` (with its optimiser state, if given) and commit its row (see above)."""
    home = adapter_dir(root, project_id, alias, 1).parent
    staging = _stage(model, home, optimizer)
    placed = False
    try:
        row = reserve(
            db,
            root,
            project_id=project_id,
            alias=alias,
            parent_version=parent_version,
            sha256=content_sha256(staging),
            base_model=base.name,
            base_sha256=base.sha256,
            training_run_id=run_id,
            metrics=jsonable(metrics),
        )
        folder = Path(row.path)
        placed = _place(staging, folder)
        if not placed:
            # Something is there that this row did not write (a folder of the old lossy names, a crash of
            # the old order, a case-insensitive file system): leave it, and put the version beside it.
            folder = home / f"v{row.version}~{row.id}"
            placed = _place(staging, folder)
            if not placed:
                raise PublishError(f"{folder} already exists; adapter versions are never overwritten")
        row.path, row.state = str(folder), ADAPTER_COMMITTED
        db.commit()
    finally:
        # Only the staging folder is ever removed. A failure after the reservation leaves the row reserved
        # (listed, deployed and trained from by nobody) and keeps its number, folder or not.
        if not placed:
            shutil.rmtree(staging, ignore_errors=True)
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
