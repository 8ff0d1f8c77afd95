"""How a serving process manages memory: the cyclic GC and glibc's heap, set once serving starts.

Both defaults are tuned for programs that build up and keep; a proxy allocates a few
hundred objects per call and frees nearly all of them by reference counting a few
milliseconds later, 64 calls at a time (bench/RESULTS.md, "Proxy performance, third round").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
HEAP_KEPT = 64 * 1024 * 1024  # freed heap memory kept for reuse, at most
MMAP_FROM = 32 * 1024 * 1024  # allocations this large get their own mapping (glibc's maximum)


def tune_for_serving() -> None:
    """Freeze what startup built, collect young objects rarely, and keep freed heap memory.

    - Everything alive now (modules, FastAPI, SQLAlchemy, pydantic: ~10^5 objects) lives as
      long as the process; frozen, full collections stop rescanning it (12-16 % of a call's
      CPU under load before).
    - The young generation is collected after 20,000 net allocations instead of 700: at 700 it
      ran every few calls and rescanned the in-flight calls' objects each time (~7 % of a call's
      CPU at concurrency 64, in-process); cyclic garbage waits for a few MB at most.
    - glibc returned the top of its heap to the kernel whenever more than 128 kB was free, and
      took it back (page faults, zeroed pages) on the next burst of calls: a Responses or
      Messages call (bigger objects) faulted ~1.7 times a call at concurrency 64, chat none.
      Up to 64 MB of freed heap is now kept, and blocks up to 32 MB come from the heap
      (setting the trim threshold switches off glibc's adaptive mmap threshold).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)
    if sys.platform.startswith("linux"):
        _mallopt({M_TRIM_THRESHOLD: HEAP_KEPT, M_TOP_PAD: 1024 * 1024, M_MMAP_THRESHOLD: MMAP_FROM})


def _mallopt(settings: dict[int, int]) -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its defaults stay
        return
    for param, value in settings.items():
        mallopt(ctypes.c_int(param), ctypes.c_int(value))
