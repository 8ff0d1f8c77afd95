"""``trainer.runner.run`` under torchrun: rank 0 owns the database, both ranks train. Used by test_dist.py."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.trainer.test_runner import Pool, _args, _pool
from trainer.runner import run

if __name__ == "__main__":
    url, project, tmp = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    args = _args(url, project, tmp, "http://unused", "--no-deploy", "--steps", "2", "--batch-size", "5")
    sys.exit(run(args, loader=Pool(_pool(10))))
