"""A text part weighted 0 is not computed: its examples are passed over, counted, never handed to the step."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from trainer.runner import TEXT_WEIGHT_ZERO, _next_batch
from trainer.settings import TrainSettings
from trainer.textual import TextualExample


class _Feed:
    def __init__(self, examples: list[Any]) -> None:
        self.examples = examples

    def poll(self, db: Any) -> tuple[list[Any], Counter[str]]:
        return self.examples, Counter({"ungraded": 2})


class _Db:
    def rollback(self) -> None:
        pass


class _Example:
    def __init__(self, objective: str) -> None:
        self.objective = objective


def test_a_part_weighted_zero_is_passed_over_and_counted() -> None:
    feed = _Feed([_Example("sdpo"), _Example("correction"), _Example("sdpo")])
    load = lambda db, project, alias: ([], {})  # noqa: E731
    for sdpo, correction, kept, skipped in ((1.0, 1.0, 3, 0), (0.0, 1.0, 1, 2), (1.0, 0.0, 2, 1)):
        settings = TrainSettings(alias="a", database_url="x", objective="sdpo", sdpo_weight=sdpo,
                                 correction_weight=correction)  # fmt: skip
        _, textual, excluded = _next_batch(cast(Any, _Db()), settings, load, cast(Any, feed))
        assert len(textual) == kept and excluded[TEXT_WEIGHT_ZERO] == skipped and excluded["ungraded"] == 2
        assert all(isinstance(e, _Example) for e in cast(list[TextualExample], textual))
