"""How a serving process uses the cyclic garbage collector, set once serving starts.

Python's defaults suit programs that build up and keep; a proxy allocates a few hundred
objects per call and frees nearly all of them by reference counting milliseconds later,
64 calls at a time (bench/journal/2026-12-01.md, "Proxy performance, third round").
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # net container allocations between two young-generation collections (default 700)


def tune_for_serving() -> None:
    """Freeze what startup built and collect the young generation rarely.

    - Everything alive now (modules, FastAPI, SQLAlchemy, pydantic: ~10^5 objects) lives as
      long as the process; frozen, full collections stop rescanning it (12-16 % of a call's
      CPU under load before).
    - At the default threshold the young generation was collected every few calls and
      rescanned the in-flight calls' objects each time (in-process, concurrency 64: ~40 us of
      ~550 us a call in the collector under load; ~3 us after). Cyclic garbage now waits for
      20,000 net allocations: a few MB at most.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 10)
