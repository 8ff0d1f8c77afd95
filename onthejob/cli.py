"""The `onthejob` command: one entry point for people.

Heavy imports (torch, vllm, the proxy app) happen inside each command, so
`onthejob --help` is instant and the parser can be used on its own (the compose
test runs every service's command line through :func:`build_parser`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from onthejob import commands, datasets, record_commands

Handler = Callable[[argparse.Namespace], int]


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default | tiny | PATH to a local model folder")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads for the CPU engine")
    p.add_argument("--kv-cache-gib", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=2048)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, without running anything."""
    parser = argparse.ArgumentParser(prog="onthejob", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("engine", help="start a real vLLM engine with runtime LoRA loading")
    _engine_args(p)
    p.set_defaults(handler=commands.engine)

    p = sub.add_parser("serve", help="run the recording OpenAI proxy")
    p.add_argument("--upstream", action="append", default=None, help="engine base URL (repeat for replicas)")
    p.add_argument("--db", default=None, help="database URL (default: $DATABASE_URL or sqlite:///onthejob.db)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--spool", default=None, help="spool folder (default: ./spool)")
    p.add_argument("--no-auth", action="store_true", help="accept calls without an API key (development only)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--host-id", default=None, help="this host among proxies on one database (default: $ONTHEJOB_HOST_ID, hostname)"
    )
    p.add_argument(
        "--no-housekeep",
        action="store_true",
        help="leave the feedback sweep, retention and pruning to `onthejob housekeep`",
    )
    p.add_argument(
        "--no-migrate", action="store_true", help="do not migrate at start (a migration Job runs `onthejob db upgrade`)"
    )
    p.set_defaults(handler=commands.serve)

    p = sub.add_parser("train", help="train LoRA adapters from graded traffic")
    p.add_argument("--alias", required=True)
    p.add_argument("--model", default="default", help="default | tiny | PATH (the engine's base model)")
    p.add_argument("--watch", action="store_true", help="keep training as new graded traffic arrives")
    p.add_argument("--steps", type=int, default=None, help="steps to take (default: 1; with --watch: no limit)")
    p.add_argument(
        "--objective",
        choices=["tis", "ppo", "bc", "sdpo"],
        default="tis",
        help="sdpo: tis on scored traffic plus self-distillation and corrections from text feedback",
    )
    p.add_argument("--sdpo-weight", type=float, default=1.0, help="sdpo: weight of the self-distillation part")
    p.add_argument("--correction-weight", type=float, default=1.0, help="sdpo: weight of SFT on corrections")
    p.add_argument(
        "--sdpo-form",
        choices=["token", "topk"],
        default="token",
        help="sdpo: sampled-token signal, or reverse KL over the top-k tokens plus a tail bucket",
    )
    p.add_argument(
        "--sdpo-baseline",
        choices=["none", "mean"],
        default="none",
        help="sdpo, token form: mean subtracts the mean teacher-student signal of each chunk of examples",
    )
    p.add_argument(
        "--sdpo-teacher",
        choices=["frozen", "ema", "live"],
        default="frozen",
        help="sdpo: the teacher's weights: the serving version frozen, a slow EMA, or the stepped ones",
    )
    p.add_argument("--sdpo-ema", type=float, default=0.05, help="sdpo, --sdpo-teacher ema: rate per step")
    p.add_argument(
        "--sdpo-signal-clip",
        type=float,
        default=2.0,
        help="sdpo: clip each token's teacher-student log-ratio to ± this (0: unclipped)",
    )
    p.add_argument("--sdpo-kl", type=float, default=0.1, help="sdpo: weight of KL(student || serving version)")
    p.add_argument(
        "--step-floor",
        type=float,
        default=0.0,
        help="AdamW's eps: a gradient weaker than this takes a proportionally smaller step (0: 1e-8)",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--proxy", default="http://127.0.0.1:8000", help="proxy URL for deployments")
    p.add_argument("--admin-key", default=None, help="admin API key (default: $ONTHEJOB_ADMIN_KEY)")
    p.add_argument("--adapters", default="adapters", help="folder the engines can read adapters from")
    p.add_argument("--project", default="default")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--no-deploy", action="store_true")
    p.add_argument("--parent", default="latest", help="adapter to continue from: latest | deployed | base | N")
    p.add_argument(
        "--fresh-optimizer",
        action="store_true",
        help="start AdamW afresh instead of continuing the parent adapter's saved moments",
    )
    p.add_argument("--min-batch", type=int, default=1, help="wait for at least this many trajectories")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between polls with --watch")
    p.add_argument("--max-len", type=int, default=2048, help="longer trajectories are dropped and counted")
    p.add_argument("--threads", type=int, default=None, help="torch threads per process (default: cores / ranks)")
    p.add_argument("--dataset", default=None, help="train exactly this dataset's pinned items (all of them), then stop")
    p.set_defaults(handler=commands.train)

    p = sub.add_parser("judge", help="grade comment-only and ungraded sessions with the project's judge")
    p.add_argument("--project", default="default")
    p.add_argument("--db", default=None)
    p.add_argument("--proxy", default="http://127.0.0.1:8000", help="where grades are posted (and the judge called)")
    p.add_argument(
        "--key",
        default=None,
        help="a key of the project (default: $ONTHEJOB_JUDGE_KEY, else $ONTHEJOB_ADMIN_KEY)",
    )
    p.add_argument("--alias", default=None, help="judge only this alias's sessions")
    p.add_argument("--watch", action="store_true", help="keep judging as sessions arrive")
    p.add_argument("--poll", type=float, default=30.0, help="seconds between passes with --watch")
    p.add_argument("--no-calibrate", action="store_true", help="judge without re-measuring agreement first")
    p.add_argument("--dry-run", action="store_true", help="score and report, post nothing")
    p.set_defaults(handler=commands.judge)

    p = sub.add_parser("monitor", help="compare each version's traffic with its predecessor's; raise alerts")
    p.add_argument("--db", default=None)
    p.add_argument("--project", default=None, help="only this project (default: every project)")
    p.add_argument("--alias", default=None, help="only this alias")
    p.add_argument("--watch", action="store_true", help="keep monitoring, one pass every --interval seconds")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between passes with --watch")
    p.add_argument("--drift-engine", default=None, help="engine URL: measure KL from the base model on a sample")
    p.add_argument("--drift-sample", type=int, default=32, help="calls per version the drift probe scores")
    p.add_argument("--json", action="store_true", help="print each pass's windows and breaches as JSON")
    p.set_defaults(handler=commands.monitor)

    p = sub.add_parser("eval", help="evaluate one version of an alias through the proxy and store the result")
    p.add_argument("--alias", required=True)
    p.add_argument("--version", default=None, help="adapter version number, or 'base' (default: the serving one)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--set", default=None, help="a JSONL eval set: prompt or messages, reference, schema, id")
    source.add_argument("--tag", default=None, help="replay the first user turn of sessions with this tag (eval)")
    p.add_argument("--since", default=None, help="with --tag: only sessions since this ISO time")
    p.add_argument("--grader", default="exact", help="exact | regex | numeric | json-schema | judge | module:function")
    p.add_argument("--name", default=None, help="the eval's name (versions are compared within one; default: set)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N items")
    p.add_argument("--plot", default=None, help="write a PNG of this eval's mean ± s.e. per version")
    p.add_argument("--no-post", action="store_true", help="print the result, store nothing")
    p.add_argument("--proxy", default="http://127.0.0.1:8000")
    p.add_argument("--admin-key", default=None, help="admin API key (default: $ONTHEJOB_ADMIN_KEY)")
    p.add_argument("--project", default="default")
    p.add_argument("--db", default=None, help="database (for --tag and --grader judge)")
    p.set_defaults(handler=commands.evaluate)

    p = sub.add_parser("deploy", help="roll an alias forward or back to an adapter version")
    p.add_argument("--alias", required=True)
    p.add_argument("--version", required=True, help="adapter version number, or 'base'")
    p.add_argument("--proxy", default="http://127.0.0.1:8000")
    p.add_argument("--admin-key", default=None)
    p.set_defaults(handler=commands.deploy)

    p = sub.add_parser("demo", help="the whole loop on this machine: engine, proxy, harness, trainer")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default="demo-out")
    p.add_argument("--model", default="default")
    p.add_argument(
        "--feedback",
        choices=["numeric", "comments", "corrections", "none"],
        default="numeric",
        help="how training traffic is graded: numbers (default), comments only, corrections only, or not at all",
    )
    p.add_argument("--seed", type=int, default=0, help="which training problems each round draws (held-out is fixed)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="held-out evaluation at round 1, every N-th round after it and the last round (default 1: every round)",
    )
    p.add_argument(
        "--promotion",
        choices=["auto", "gate"],
        default="auto",
        help="gate: each trained version is routed only if its held-out result is not 2 s.e. below the serving one",
    )
    p.add_argument(
        "--sdpo-form",
        choices=["token", "topk"],
        default=None,
        help="comments/corrections arms: train --sdpo-form (token: sampled-token signal; topk: top-k reverse KL)",
    )
    p.add_argument("--lr", type=float, default=None, help="the trainer's learning rate each round (default 5e-4)")
    p.add_argument(
        "--sdpo-baseline",
        choices=["none", "mean"],
        default=None,
        help="comments/corrections arms: train --sdpo-baseline (token form)",
    )
    p.add_argument(
        "--sdpo-weight",
        type=float,
        default=None,
        help="comments/corrections arms: train --sdpo-weight (text part beside judged scores)",
    )
    p.add_argument(
        "--correct",
        choices=["last", "first"],
        default=None,
        help="corrections arm: correct the last call's ANSWER line, or the first call's CALC",
    )
    p.add_argument(
        "--no-judge",
        dest="judge",
        action="store_false",
        default=None,
        help="comments arm: no judge, self-distillation alone (none arm: nothing at all)",
    )
    p.add_argument(
        "--flip-reward",
        default=None,
        metavar="ROUNDS",
        help="comma-separated rounds whose training traffic is graded with the reward's sign flipped (a bad grader)",
    )
    p.add_argument("--jobs", choices=["one", "two"], default="one", help="two: two task families, one gated watcher")
    p.add_argument("--minutes", type=float, default=None, help="--jobs two: when traffic stops (default 10)")
    p.set_defaults(handler=commands.demo)

    db = sub.add_parser("db", help="database schema")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    p = dbsub.add_parser("upgrade", help="migrate the schema to the newest version")
    p.add_argument("--db", default=None)
    p.add_argument("--revision", default="head")
    p.set_defaults(handler=commands.db_upgrade)
    p = dbsub.add_parser("downgrade", help="migrate the schema down (default: to an empty database)")
    p.add_argument("--db", default=None)
    p.add_argument("--revision", default="base")
    p.set_defaults(handler=commands.db_downgrade)

    keys = sub.add_parser("keys", help="API keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = ksub.add_parser("create", help="create an API key (printed once)")
    p.add_argument("--project", default="default")
    p.add_argument("--role", choices=["harness", "admin"], default="harness")
    p.add_argument("--name", default="")
    p.add_argument("--db", default=None)
    p.set_defaults(handler=commands.keys_create)

    p = sub.add_parser("export", help="write graded trajectories as JSONL (sft | dpo | rl)")
    p.add_argument("--format", choices=["sft", "dpo", "rl"], required=True)
    p.add_argument("--alias", default=None)
    p.add_argument("--min-reward", type=float, default=None)
    p.add_argument("--since", default=None, help="ISO time; only sessions updated since")
    p.add_argument("--project", default="default")
    p.add_argument("--db", default=None)
    p.add_argument("--dataset", default=None, help="this dataset's pinned trajectories and rewards")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(handler=record_commands.export)

    _dataset_parsers(sub)

    p = sub.add_parser("mine", help="flag failure modes in recorded calls (incrementally) and report them")
    p.add_argument("--alias", default=None)
    p.add_argument("--since", default=None, help="ISO time; report only calls since")
    p.add_argument("--out", default="mine-report", help="folder for mine.json, mine.md and mine.png")
    p.add_argument("--project", default="default")
    p.add_argument("--db", default=None)
    p.set_defaults(handler=record_commands.mine)

    p = sub.add_parser(
        "retention",
        help="delete calls older than each project's retention_days (one pass)"
        " and the change-log entries every reader has passed",
    )
    p.add_argument("--db", default=None)
    p.add_argument(
        "--keep-changes",
        type=int,
        default=None,
        metavar="N",
        help="change-log entries kept per project whatever the readers passed (default 100000)",
    )
    p.set_defaults(handler=record_commands.retention)

    p = sub.add_parser(
        "housekeep",
        help="the database's periodic maintenance on one schedule: feedback sweep, "
        "retention, change-log pruning (safe to run as several copies)",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--once", action="store_true", help="run every job once now, then exit")
    p.add_argument(
        "--sweep-every",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between sweeps of pending feedback (0: never)",
    )
    p.add_argument(
        "--retention-every",
        type=float,
        default=None,
        metavar="S",
        help="seconds between retention passes (default $ONTHEJOB_RETENTION_EVERY or 3600)",
    )
    p.add_argument(
        "--prune-every",
        type=float,
        default=None,
        metavar="S",
        help="seconds between prunings of the change log (default: the retention period)",
    )
    p.add_argument(
        "--keep-changes",
        type=int,
        default=None,
        metavar="N",
        help="change-log entries kept per project whatever the readers passed (default 100000)",
    )
    # `serve` starts this with its stdin a pipe it holds: the copy ends when the pipe closes (serve ended).
    p.add_argument("--until-stdin-closes", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=record_commands.housekeep)
    return parser


def _dataset_parsers(sub: Any) -> None:
    """``onthejob dataset create | list | show | diff`` (onthejob/datasets.py)."""
    ds = sub.add_parser("dataset", help="named, immutable selections of trajectories for train and export")
    dsub = ds.add_subparsers(dest="dataset_command", required=True, metavar="ACTION")
    p = dsub.add_parser("create", help="select trajectories and pin them (calls, feedback, rewards) under a name")
    p.add_argument("name")
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="alias, tags, since, until, min_reward, max_reward, flags, feedback, judge (agrees|disagrees);"
        " lists comma-separated; repeat for several",
    )
    p.add_argument("--from-mine", default=None, metavar="MODE", help="trajectories onthejob mine flagged with MODE")
    p.add_argument(
        "--curated",
        action="store_true",
        help="failures (flagged or graded low) with the best successes of the same task",
    )
    p.add_argument("--per-task", type=int, default=2, help="--curated: successes kept per failing task")
    p.add_argument("--description", default="")
    for name, helptext in (
        ("list", "every dataset of the project"),
        ("show", "one dataset and its items"),
        ("diff", "items only in A, only in B, and in both with other values"),
    ):
        q = dsub.add_parser(name, help=helptext)
        if name == "show":
            q.add_argument("name")
        if name == "diff":
            q.add_argument("a")
            q.add_argument("b")
        q.add_argument("--json", action="store_true", help="print the answer as JSON")
    for q in dsub.choices.values():
        q.add_argument("--project", default="default")
        q.add_argument("--db", default=None)
        q.set_defaults(handler=datasets.run)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM behaves like Ctrl-C, so every command cleans up the same way.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except commands.UserError as exc:
        print(f"onthejob {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
