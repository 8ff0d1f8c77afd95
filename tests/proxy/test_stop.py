"""The app's stop always ends: a background task that loses a cancellation is cancelled again.

Python 3.11's ``asyncio.wait_for`` can swallow a cancellation that arrives as its inner wait ends; a loop
around it then runs on, and a stop that awaited each cancelled task without a bound hung (a CI run sat in
``tests/proxy/test_ops.py``'s app teardown while the rate-lease loop kept renewing every second).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from proxy.state import AppState

pytestmark = pytest.mark.anyio


async def test_a_task_that_swallows_one_cancellation_is_cancelled_again() -> None:
    swallowed = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # what wait_for's lost cancellation looks like from outside

    async def failing() -> None:
        raise RuntimeError("ended badly")  # retrieved by the stop: not reported as never retrieved

    tasks = [asyncio.create_task(loop(), name="stubborn"), asyncio.create_task(failing(), name="failed")]
    await asyncio.sleep(0)
    async with asyncio.timeout(30):  # without the second cancel this waits forever
        await AppState._cancel_tasks(SimpleNamespace(tasks=tasks))  # type: ignore[arg-type]
    assert swallowed == [True] and all(t.done() for t in tasks)
