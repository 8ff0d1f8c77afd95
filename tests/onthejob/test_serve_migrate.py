"""``serve`` migrates at start unless ``--no-migrate`` (Kubernetes' migration Job does it instead)."""

from __future__ import annotations

from typing import Any

import pytest

import proxy.main
from onthejob.cli import build_parser


@pytest.mark.parametrize(("flags", "migrated"), [([], 1), (["--no-migrate"], 0)])
def test_serve_migrates_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, flags: list[str], migrated: int) -> None:
    upgrades: list[Any] = []
    served: list[Any] = []
    monkeypatch.setenv("ONTHEJOB_HOUSEKEEP", "1")  # serve sets it for its workers; put back after the test
    monkeypatch.setattr(proxy.main, "upgrade", upgrades.append)
    monkeypatch.setattr(proxy.main.uvicorn, "run", lambda app, **kw: served.append(kw))
    monkeypatch.setattr(proxy.main, "create_app", lambda settings: settings)
    args = build_parser().parse_args(["serve", "--db", "sqlite:///unused.db", "--no-auth", "--no-housekeep", *flags])
    assert args.handler(args) == 0
    assert (len(upgrades), len(served)) == (migrated, 1)
