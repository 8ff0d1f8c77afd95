"""Projects' redaction policies, kept on disk beside the spool so that redaction fails closed.

A proxy that starts while the database is down cannot read the policies; recording
with an empty one would spool unredacted text for a project that asked for
redaction. So every policy read from the database is also written to
``policies.json`` in the spool root (atomically, only when it changed), and read
back at start. A project's policy is *known* when the last database read included
it, or when the database was never read yet but the file has it. A project the
database has not answered for is unknown: its calls get 503 ``redaction_policy_unknown``
before they reach the engine, never an unredacted record.

Once the database has answered, a project it did not list has no settings, hence
no redaction (a policy is set through the admin API, which writes that row first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from proxy.errors import Unavailable
from proxy.redact import RedactionPolicy

FILE = "policies.json"


class PolicyUnknown(Unavailable):
    """503: the project's redaction policy cannot be known now, so nothing of it may be recorded."""


class Policies:
    """Each project's :class:`RedactionPolicy`: from the database when it answers, else from the last copy on disk."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FILE
        self._policies: dict[str, RedactionPolicy] = {}
        self._written: dict[str, Any] | None = None
        self.from_database = False  # True once the database has answered this process

    def load(self) -> None:
        """Read the last known policies (start-up; the database may be down)."""
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # none yet, or unreadable: every project is unknown until the database answers
        if not self.from_database and isinstance(raw, dict):
            redact = {p: r for p, r in raw.items() if isinstance(r, dict)}
            self._policies = {p: RedactionPolicy.from_settings({"redact": r}) for p, r in redact.items()}
            self._written = redact

    def update(self, settings: dict[str, dict[str, Any] | None]) -> None:
        """Every project's settings as the database has them now; the disk copy follows if it changed."""
        redact = {p: dict((s or {}).get("redact") or {}) for p, s in settings.items()}
        self._policies = {p: RedactionPolicy.from_settings({"redact": r}) for p, r in redact.items()}
        self.from_database = True
        if redact != self._written:
            self._write(redact)

    @property
    def source(self) -> str:
        """Where this process's policies come from: ``database``, ``last_known`` (the copy on disk), or
        ``none`` (neither yet: every recorded call is refused until the database answers)."""
        if self.from_database:
            return "database"
        return "last_known" if self._policies else "none"

    def get(self, project: str) -> RedactionPolicy:
        """The project's policy, or :class:`PolicyUnknown` (503) when it cannot be known."""
        policy = self._policies.get(project)
        if policy is not None:
            return policy
        if self.from_database:
            return RedactionPolicy()
        raise PolicyUnknown(
            f"project {project!r}'s redaction policy is unknown: the database has been unreachable since this "
            "proxy started and its last known policies do not list it. Nothing is recorded unredacted: retry "
            "when the database is back",
            code="redaction_policy_unknown",
        )

    def _write(self, redact: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{FILE}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as fh:
                json.dump(redact, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)  # workers share the file: each replace is whole
        except OSError:
            return  # a full or read-only disk: the next refresh tries again
        self._written = redact
