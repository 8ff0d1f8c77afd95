"""Where recording's CPU goes: the proxy's own and Postgres', per 1,000 calls, recording on and off.

Throughput on a shared 2-core machine says little; CPU seconds per call hold up under
load much better. This starts the stub and two ``onthejob serve`` (recording on and
off, on one throwaway database), drives each in turn at concurrency 64 for
``--seconds``, waits until the spool has drained, and reads the CPU the proxy process
and the Postgres processes spent meanwhile: the backends of the bench database, and
the cluster's background processes (WAL writer, checkpointer, ...: shared with
whatever else uses this Postgres, so only indicative on a busy machine). Rounds
alternate on and off, each round starting one server later (the slot in a round
biases a server's figures here); the medians are printed, then the on - off difference.

``--checkout NAME=PATH`` adds a recording-on proxy run from another checkout (``git worktree
add --detach PATH COMMIT``) to the same rounds, and prints its medians as a ratio of this
checkout's: the only A/B of proxy code that held up on this machine, whose speed drifts by
a third between runs. Give ``--rounds`` a multiple of the number of servers, so that each
takes every slot equally often.

``--turns N`` sends, instead of one short message, a conversation of N user and assistant turns
that no recorded call produced (as a prompt of few-shot examples, or a history from elsewhere,
arrives): each call then looks for a parent it cannot find.

``--pyspy PATH`` (a py-spy binary) also samples both proxies' Python (the thread holding
the GIL) in an extra last round, prints where recording on's went (bench/profile_proxy.py's
summary) and keeps recording off's samples beside it.

Run: ``python -m bench.recording_cpu [--seconds 8] [--rounds 4] [--checkout NAME=PATH ...]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import uvloop

from bench import peers
from bench.harness import Server, count_rows, pin_self, rotated, stat_cpu, throwaway_database, wait_spool_empty
from bench.loadgen import run_load
from bench.profile_proxy import long_chat, summarise
from bench.proxy_overhead import payload


def postgres_cpu(db_name: str) -> tuple[float, float]:
    """CPU seconds so far of (the backends of ``db_name``, the cluster's other processes but other backends)."""
    mine = other = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "(postgres)" not in (entry / "stat").read_text():
                continue
            title = (entry / "cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
        except OSError:
            continue
        cpu = sum(stat_cpu(entry / "stat"))
        if f" {db_name} " in title:
            mine += cpu
        elif "(" not in title.split(":", 1)[-1]:  # a background process, not a client backend ("host(port)")
            other += cpu
    return mine, other


def threads_cpu(pid: int) -> tuple[float, float, float, float]:
    """CPU seconds so far of a process's main thread (the event loop), user and system, and of its other
    threads; and how often the main thread was switched out while it could still run (preempted)."""
    main_user = main_sys = others = preempted = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        user, system = stat_cpu(task / "stat")
        if task.name == str(pid):
            main_user, main_sys = user, system
            status = (task / "status").read_text()
            preempted = float(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        else:
            others += user + system
    return main_user, main_sys, others, preempted


async def one(
    server: Server, body: bytes, db_url: str, seconds: float, record: bool, lossy: bool = False
) -> dict[str, float]:
    db_name = db_url.rsplit("/", 1)[1]
    cpu0, (pg0, bg0), t0 = server.cpu_s(), postgres_cpu(db_name), time.perf_counter()
    th0 = threads_cpu(server.proc.pid)
    result = await run_load("127.0.0.1", server.port, body, concurrency=64, duration_s=seconds, warmup_s=0.5)
    if record:
        wait_spool_empty(server.url)
    cpu, (pg, bg), wall = server.cpu_s() - cpu0, postgres_cpu(db_name), time.perf_counter() - t0
    loop_user, loop_sys, threads, preempted = (b - a for a, b in zip(th0, threads_cpu(server.proc.pid), strict=True))
    done = max(1, result.total_done)
    if record and not lossy and (landed := count_rows(db_url, result.all_ids)) != len(set(result.all_ids)):
        raise SystemExit(f"records lost: {len(set(result.all_ids)) - landed}")
    return {
        "rps": result.rps,
        "proxy": cpu / done * 1000,
        "pg": (pg - pg0) / done * 1000,
        "pg_bg": (bg - bg0) / done * 1000,
        "loop_user": loop_user / done * 1000,
        "loop_sys": loop_sys / done * 1000,
        "threads": threads / done * 1000,
        "preempted": preempted / done,
        "calls": done,
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pyspy", type=Path, help="a py-spy binary: profile the recording proxy in an extra round")
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also a recording-on proxy run from another checkout (a worktree of another commit), in the same "
        "alternating rounds: an A/B that the machine's drift between runs cannot fake (repeatable)",
    )
    parser.add_argument(
        "--lossy",
        action="append",
        default=[],
        metavar="NAME",
        help="a --checkout whose records do not all land by design (an ablation: bench/recording_split.py); "
        "the lost-records check is skipped for it alone",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=0,
        help="a conversation of this many user/assistant turns no recorded call produced",
    )
    parser.add_argument("--turn-chars", type=int, default=1500, help="characters in each message of --turns")
    args = parser.parse_args()
    measure(
        args.seconds,
        args.rounds,
        dict(spec.split("=", 1) for spec in args.checkout),
        args.lossy,
        args.pyspy,
        turns=args.turns,
        turn_chars=args.turn_chars,
    )


def measure(
    seconds: float,
    rounds: int,
    checkouts: dict[str, str],
    lossy: Sequence[str] = (),
    pyspy: Path | None = None,
    *,
    turns: int = 0,
    turn_chars: int = 1500,
) -> dict[str, dict[str, float]]:
    """Run the rounds and print them and their medians; returns the medians by server name (``on@NAME``
    for a checkout; ``lossy``: checkouts whose lost records are not counted)."""
    pin_self({0})
    logdir = Path(tempfile.mkdtemp(prefix="onthejob-reccpu-"))
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": [], **{f"on@{n}": [] for n in checkouts}}
    with throwaway_database() as db_url:
        stub = peers.stub(logdir, {0})
        servers = {
            "on": peers.onthejob(stub.url, db_url, logdir / "spool-on", logdir, {1}, record=True, name="rec-on"),
            "off": peers.onthejob(stub.url, db_url, logdir / "spool-off", logdir, {1}, record=False, name="rec-off"),
        }
        for label, path in checkouts.items():
            servers[f"on@{label}"] = peers.onthejob(
                stub.url,
                db_url,
                logdir / f"spool-{label}",
                logdir,
                {1},
                record=True,
                name=f"rec-{label}",
                checkout=Path(path).resolve(),
            )
        try:
            for i in range(rounds + bool(pyspy)):
                for name, server in rotated(list(servers.items()), i):
                    spy = None
                    if i == rounds:  # the extra round: profile both
                        spy = subprocess.Popen(
                            [
                                str(pyspy),
                                "record",
                                "--pid",
                                str(server.proc.pid),
                                "--rate",
                                "200",
                                "--format",
                                "raw",
                                "--output",
                                str(logdir / f"pyspy-{name}.txt"),
                                "--duration",
                                str(int(seconds)),
                                "--gil",
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    if turns:
                        body = long_chat(server.port, turns, turn_chars, False, 16)
                    else:
                        body = payload(server.port, False, 16)
                    dropped = name.removeprefix("on@") in lossy
                    run = uvloop.run(one(server, body, db_url, seconds, name != "off", dropped))
                    if spy is not None:
                        spy.wait(60)
                    else:
                        runs[name].append(run)
                    print(
                        f"  {name:6s} {run['rps']:7,.0f} req/s  CPU s/1k calls: proxy {run['proxy']:.3f} (loop user "
                        f"{run['loop_user']:.3f} sys {run['loop_sys']:.3f}, other threads {run['threads']:.3f})  "
                        f"pg backends {run['pg']:.3f}  pg background {run['pg_bg']:.3f}  loop preempted "
                        f"{run['preempted']:.2f}/call",
                        flush=True,
                    )
        finally:
            for server in (*servers.values(), stub):
                server.stop()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items() if rs}
    print(f"\nmedians, CPU s per 1k calls (c=64, non-streaming{f', {turns} turns' if turns else ''}):")
    for key in ("proxy", "loop_user", "loop_sys", "threads", "pg", "pg_bg"):
        on, off = med["on"][key], med["off"][key]
        print(f"  {key:9s} on {on:.3f}  off {off:.3f}  on-off {on - off:+.3f}")
    total = {n: m["proxy"] + m["pg"] + m["pg_bg"] for n, m in med.items()}
    print(f"  total     on {total['on']:.3f}  off {total['off']:.3f}  on-off {total['on'] - total['off']:+.3f}")
    print(
        f"  the event loop preempted per call (involuntary context switches): on {med['on']['preempted']:.2f}  "
        f"off {med['off']['preempted']:.2f}"
    )
    for name in (n for n in med if n.startswith("on@")):
        print(
            f"  {name}: proxy {med[name]['proxy']:.3f} ({med[name]['proxy'] / med['on']['proxy']:.2f}x on's), "
            f"pg {med[name]['pg']:.3f}, preempted {med[name]['preempted']:.2f}/call, "
            f"{med[name]['rps']:,.0f} req/s against on's {med['on']['rps']:,.0f}"
        )
    if pyspy:
        print(f"\nrecording on, Python (GIL) samples ({logdir}/pyspy-on.txt; recording off: pyspy-off.txt):")
        print(summarise(logdir / "pyspy-on.txt", 45))
    return med


if __name__ == "__main__":
    main()
