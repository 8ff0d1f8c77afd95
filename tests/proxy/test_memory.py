"""The serving process's memory settings (proxy/memory.py) take effect, and keep startup objects out of the GC."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from proxy.memory import YOUNG_THRESHOLD, tune_for_serving


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_serving_collects_the_young_generation_rarely_and_freezes_what_startup_built(restore_gc: None) -> None:
    kept = [{"built": "at startup"} for _ in range(100)]
    tune_for_serving()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 20, 10)
    assert gc.get_freeze_count() >= len(kept)
    assert not any(gc.is_tracked(k) and k in gc.get_objects(generation=2) for k in kept[:1])
