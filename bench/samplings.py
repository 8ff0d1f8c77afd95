"""The four sampling settings the trainer benches score under (``gpu_check``, ``train_throughput``).

Each takes a different path through the processed distribution (trainer/logprobs.py): top-p
alone, no filter (temperature 1), top-k, and top-p, top-k and min-p together.
"""

from __future__ import annotations

from typing import Any

SAMPLINGS: list[dict[str, Any]] = [
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.0},
    {"temperature": 1.3, "top_k": 40},
    {"temperature": 0.8, "top_p": 0.95, "top_k": 100, "min_p": 0.02},
]
