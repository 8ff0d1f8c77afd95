"""What a dataset's filter says: the conditions a trajectory must meet, read from the REST body or the CLI.

:class:`DatasetFilter` is pure data; :mod:`storage.dataset_select` applies it and
:mod:`storage.datasets` stores it with the dataset. The datasets' error tree starts here
(:class:`DatasetError`, its two subclasses; drawn in :mod:`storage.datasets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from storage.mining import MODES


class DatasetError(ValueError):
    """A dataset specification that cannot work; the message names the key and the fix."""


class DatasetExists(DatasetError):
    """Datasets are immutable: a name is taken once per project."""


class DatasetNotFound(DatasetError):
    """No dataset of that name in this project."""


def _when(key: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise DatasetError(f"filter.{key}: {value!r} is not an ISO time, e.g. 2026-11-30T12:00") from exc
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _number(key: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"filter.{key}: {value!r} is not a number") from exc


def _names(value: Any) -> tuple[str, ...]:
    """A list, or one comma-separated string (the CLI's ``--filter flags=timeout,truncated``)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return tuple(str(v).strip() for v in items if str(v).strip())


@dataclass(frozen=True)
class DatasetFilter:
    """Which trajectories a dataset takes; every condition given must hold (lists: any of them)."""

    alias: str | None = None
    tags: tuple[str, ...] = ()  # every one of these tags
    since: datetime | None = None  # the trajectory's last call, at or after
    until: datetime | None = None  # ... and before
    min_reward: float | None = None  # a reward range asks for a reward: ungraded trajectories are left out
    max_reward: float | None = None
    flags: tuple[str, ...] = ()  # a call of the trajectory flagged by ``onthejob mine`` with one of these modes
    feedback: tuple[str, ...] = ()  # a feedback item about it with one of these names
    judge: str | None = None  # "agrees" | "disagrees": the judge's grade against a harness or human one

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> DatasetFilter:
        """From the REST body's ``filter`` or the CLI's ``--filter KEY=VALUE``; an unknown key is refused by name."""
        raw = dict(raw or {})
        keys = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(keys))
        if unknown:
            raise DatasetError(f"filter.{unknown[0]} is not a filter; use {', '.join(keys)}")
        flags = _names(raw.get("flags"))
        if bad := [f for f in flags if f not in MODES]:
            raise DatasetError(f"filter.flags: {bad[0]!r} is not a failure mode; use {', '.join(MODES)}")
        judge = raw.get("judge")
        if judge not in (None, "agrees", "disagrees"):
            raise DatasetError(f"filter.judge: {judge!r}; use agrees or disagrees")
        return cls(
            alias=str(raw["alias"]) if raw.get("alias") else None,
            tags=_names(raw.get("tags")),
            since=_when("since", raw.get("since")),
            until=_when("until", raw.get("until")),
            min_reward=_number("min_reward", raw.get("min_reward")),
            max_reward=_number("max_reward", raw.get("max_reward")),
            flags=flags,
            feedback=_names(raw.get("feedback")),
            judge=judge,
        )

    def to_dict(self) -> dict[str, Any]:
        """What was given, JSON-ready (stored with the dataset)."""
        out = {k: v for k, v in asdict(self).items() if v not in (None, ())}
        return {
            k: v.isoformat() if isinstance(v, datetime) else list(v) if isinstance(v, tuple) else v
            for k, v in out.items()
        }
