"""TrainSettings: built once by the CLI from flags and environment, refused with the flag's name."""

from __future__ import annotations

import pytest

from onthejob.cli import build_parser, main
from onthejob.commands import UserError, train_settings
from trainer.settings import SettingsError, TrainSettings


def _settings(*flags: str) -> TrainSettings:
    return train_settings(build_parser().parse_args(["train", "--alias", "a", *flags]))


def test_flags_and_environment_become_one_settings_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_ADMIN_KEY", "from-env")
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/x")
    s = _settings("--objective", "ppo", "--parent", "3", "--no-deploy", "--watch")
    assert (s.admin_key, s.database_url, s.deploy, s.steps, s.parent_version) == (
        "from-env",
        "postgresql://db/x",
        False,
        None,
        3,
    )
    cfg = s.train_config()
    assert cfg.objective.name == "ppo" and cfg.objective.epochs == 4 and cfg.resume_optimizer
    assert _settings("--admin-key", "flag", "--db", "sqlite:///x.db").admin_key == "flag"
    assert _settings().steps == 1  # without --watch: one step


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--parent", "newest"], "--parent 'newest'"),
        (["--batch-size", "0"], "--batch-size 0"),
        (["--lr", "0"], "--lr 0"),
        (["--threads", "0"], "--threads 0"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(flags: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        _settings(*flags)


def test_the_cli_reports_a_bad_setting_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--alias", "a", "--min-batch", "0"]) == 2
    assert capsys.readouterr().err.strip() == "onthejob train: --min-batch 0: must be at least 1"


def test_settings_validate_without_the_cli() -> None:
    with pytest.raises(SettingsError, match="--objective 'sgd'"):
        TrainSettings(alias="a", database_url="sqlite://", objective="sgd")
