"""What each part of recording costs, measured by taking it away: three ablated copies of this commit, same rounds.

``bench.recording_cpu`` runs recording on and off; this adds three recording-on proxies, each
from a ``git worktree`` of ``HEAD`` with one step removed (never something to run for real):

* ``nospool``: the record is built and its spool line encoded, then ``Spool.append`` returns at
  once: nothing is written, the writer thread idles, the recorder has nothing to do;
* ``nofsync``: everything but the writer thread's fsync;
* ``norec``: everything but the recorder's database write (its segments are still sealed and deleted).

The differences of the medians are the parts: building the record (``nospool`` − off), the spool's
mechanics (``nofsync`` − ``nospool``, less the recorder's share), the fsync (on − ``nofsync``) and
the recorder (on − ``norec``). Each difference moves by ~0.01 ms between runs; the mechanics and
the fsync traded places between two runs (bench/journal/2026-12-02.md); their sum read 0.028-0.037. Committed code
only: the worktrees are of ``HEAD``. An ablation that no longer applies (the code it edits moved)
stops the run and says which.

Run: ``python -m bench.recording_split [--seconds 4] [--rounds 5]`` (rounds: a multiple of 5, the servers)
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from bench import recording_cpu
from bench.harness import ROOT

# name -> (file, text, replacement): one edit each, asserted to apply exactly once.
ABLATIONS: dict[str, tuple[str, str, str]] = {
    "nospool": (
        "proxy/spool.py",
        '        line = record.encode() + b"\\n"\n',
        '        line = record.encode() + b"\\n"\n        return line  # ABLATION: built, never written\n',
    ),
    "nofsync": (
        "proxy/spool.py",
        "                        os.fsync(self._fd)\n",
        "                        pass  # ABLATION: no fsync\n",
    ),
    "norec": (
        "proxy/recorder.py",
        "    async def _write(self, records: list[CallRecord]) -> None:\n",
        "    async def _write(self, records: list[CallRecord]) -> None:\n"
        "        return  # ABLATION: no database write\n",
    ),
}


def ablate(worktree: Path, file: str, text: str, replacement: str) -> None:
    path = worktree / file
    source = path.read_text()
    if source.count(text) != 1:
        raise SystemExit(f"the ablation of {file} no longer applies: {text.strip()!r} is not there exactly once")
    path.write_text(source.replace(text, replacement))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5, help="a multiple of 5: each server takes each slot")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="onthejob-split-"))
    trees = {name: base / name for name in ABLATIONS}
    try:
        for name, tree in trees.items():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), "HEAD"], check=True)
            ablate(tree, *ABLATIONS[name])
        med = recording_cpu.measure(
            args.seconds, args.rounds, {name: str(tree) for name, tree in trees.items()}, lossy=list(trees)
        )
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    cpu = {name: m["proxy"] for name, m in med.items()}
    recorder = cpu["on"] - cpu["on@norec"]
    parts = [
        ("building the record and its spool line", cpu["on@nospool"] - cpu["off"]),
        (
            "the spool's mechanics (hand-over, writer thread, write, waiting)",
            cpu["on@nofsync"] - cpu["on@nospool"] - recorder,
        ),
        ("the fsync", cpu["on"] - cpu["on@nofsync"]),
        ("the recorder (spool -> Postgres)", recorder),
    ]
    print(
        f"\nrecording's proxy CPU a call, by part (medians of {args.rounds}; on - off = "
        f"{cpu['on'] - cpu['off']:+.3f} ms):"
    )
    for label, ms in parts:
        print(f"  {label:66s} {ms:+.3f} ms")


if __name__ == "__main__":
    main()
