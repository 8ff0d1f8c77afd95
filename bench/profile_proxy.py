"""Profile the recording proxy under load with py-spy and print where its CPU goes.

Starts the stub and ``onthejob serve`` (recording on unless ``--no-record``), drives
it at a fixed concurrency, samples the proxy process with ``py-spy record`` for the
whole run, and prints the top functions by inclusive and by self share of samples
(threads combined; idle samples excluded), plus the raw collapsed stacks' path.

Run: ``.venv/bin/python -m bench.profile_proxy [--dialect responses] [--concurrency 64] [--stream] [--seconds 10]``
(needs ``py-spy`` in the venv: ``.venv/bin/pip install py-spy``; root, or ptrace allowed).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import orjson
import uvloop

from bench import peers
from bench.dialects import BODIES
from bench.dialects import payload as dialect_payload
from bench.harness import PY, count_rows, pin_self, throwaway_database, wait_spool_empty
from bench.loadgen import build_request, pct, run_load

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m['func']} ({path})"


def summarise(raw: Path, top: int) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        if frames[0].startswith(("Session.", "AsyncSession.", "greenlet")):
            # SQLAlchemy's async layer runs ORM code in a greenlet: py-spy shows that stack without
            # the coroutine that awaited it. Under bench load that is the recorder (auth is off).
            frames.insert(0, "[greenlet: SQLAlchemy sync side of an awaited DB call]")
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    out = [f"{total} samples (non-idle)", "", "inclusive share:"]
    out += [f"  {c / total:6.1%}  {f}" for f, c in inclusive.most_common(top)]
    out += ["", "self share:"]
    out += [f"  {c / total:6.1%}  {f}" for f, c in own.most_common(top)]
    return "\n".join(out)


def long_chat(port: int, turns: int, chars: int, stream: bool, max_tokens: int) -> bytes:
    """A chat call deep into an agent session: ``turns`` user and assistant messages of ``chars`` each."""
    messages = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: " + "observation text " * (chars // 17)})
        messages.append({"role": "assistant", "content": f"step {turn}: " + "reasoning words " * (chars // 16)})
    messages.append({"role": "user", "content": "And now?"})
    body = {"model": peers.MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    return build_request("127.0.0.1", port, "/v1/chat/completions", orjson.dumps(body))


async def drive(port: int, body: bytes, conc: int, seconds: float) -> tuple[float, float, list[str]]:
    res = await run_load("127.0.0.1", port, body, concurrency=conc, duration_s=seconds, warmup_s=0.5)
    return res.rps, pct(res.latencies_ms(), 50), res.all_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dialect", default="chat", choices=list(BODIES), help="the API the load speaks")
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL (CPU in Python)")
    parser.add_argument("--turns", type=int, default=0, help="chat: a conversation of this many user/assistant turns")
    parser.add_argument("--turn-chars", type=int, default=1500, help="characters in each message of --turns")
    args = parser.parse_args()
    load_cores, peer_cores = ({0}, {1}) if args.pin else (None, None)
    pin_self(load_cores)
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-profile-"))
    raw = logdir / "pyspy.txt"
    with throwaway_database() as db_url:
        stub = peers.stub(logdir, load_cores)
        proxy = peers.onthejob(
            stub.url, db_url, logdir / "spool", logdir, peer_cores, record=args.record, name="onthejob"
        )
        try:
            spy = subprocess.Popen(
                [
                    str(Path(PY).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(proxy.proc.pid),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--duration",
                    str(int(args.seconds + 1)),
                    *(["--gil"] if args.gil else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if args.turns:  # a long agent conversation instead of one short message
                body = long_chat(proxy.port, args.turns, args.turn_chars, args.stream, args.max_tokens)
            else:
                body = dialect_payload(proxy.port, args.dialect, args.stream, args.max_tokens)
            rps, p50, ids = uvloop.run(drive(proxy.port, body, args.concurrency, args.seconds))
            spy.wait(60)
            if args.record:
                wait_spool_empty(proxy.url)
                lost = len(set(ids)) - count_rows(db_url, list(set(ids)))
            else:
                lost = 0
        finally:
            proxy.stop()
            stub.stop()
    print(
        f"onthejob {args.dialect} record={args.record} stream={args.stream} c={args.concurrency}: {rps:,.0f} req/s, "
        f"p50 {p50:.3f} ms (slowed by sampling), records lost {lost}"
    )
    print(summarise(raw, args.top))
    print(f"\ncollapsed stacks: {raw}")


if __name__ == "__main__":
    main()
