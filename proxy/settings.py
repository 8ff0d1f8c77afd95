"""One settings object per proxy process: CLI flags over ``ONTHEJOB_*`` env over laptop defaults.

The proxy process reads its environment here and nowhere else (``DATABASE_URL`` included).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from storage.db import database_url as resolve_database_url
from storage.keys import check_chosen_secret

ACCESS = ("open", "admin", "off")


def _env(name: str, default: str) -> str:
    return os.environ.get(f"ONTHEJOB_{name}", default)


@dataclass
class Settings:
    upstreams: list[str] = field(default_factory=lambda: _env("UPSTREAM", "http://127.0.0.1:8001").split(","))
    database_url: str | None = None  # None: $DATABASE_URL or sqlite:///onthejob.db, resolved at construction
    spool_dir: Path = field(default_factory=lambda: Path(_env("SPOOL", "spool")))
    # One id per `serve` process tree (all its workers share it): several proxy hosts on one database tell
    # their rate-limit leases, link-index rows and spools apart by it. The machine's name unless set.
    host_id: str = field(default_factory=lambda: _env("HOST_ID", "") or socket.gethostname())
    # How many worker processes this host's `serve` runs (``--workers``): before its first rate-limit lease
    # each worker takes 1/workers of the host's share (proxy/ratelimit.py).
    workers: int = field(default_factory=lambda: int(_env("WORKERS", "1")))
    auth: bool = field(default_factory=lambda: _env("AUTH", "1") not in ("0", "false", "no"))
    default_project: str = "default"
    max_body_bytes: int = field(default_factory=lambda: int(_env("MAX_BODY_BYTES", str(32 * 1024 * 1024))))
    connect_timeout_s: float = field(default_factory=lambda: float(_env("CONNECT_TIMEOUT", "10")))
    # Longest silence allowed between two chunks (or before a non-streamed reply); no total timeout.
    idle_timeout_s: float = field(default_factory=lambda: float(_env("IDLE_TIMEOUT", "300")))
    spool_max_bytes: int = field(default_factory=lambda: int(_env("SPOOL_MAX_BYTES", str(2 * 1024**3))))
    # When the spool is full: "refuse" new calls with 503 (default) or "serve" them unrecorded (counted).
    spool_full_policy: str = field(default_factory=lambda: _env("SPOOL_FULL_POLICY", "refuse"))
    drain_batch: int = 500
    alias_refresh_s: float = 0.5  # every replica sees a new deployment within 1 s
    reconcile_every_s: float = 5.0  # how often pending feedback and orphaned spools are swept
    # How often an engine replica in rotation is probed (reloads lost adapters, unloads unneeded ones);
    # one out of rotation is probed every second.
    probe_every_s: float = field(default_factory=lambda: float(_env("PROBE_EVERY", "5")))
    # How often each replica's attested versions are probed again (proxy/attest.py), and candidates decided.
    attest_every_s: float = field(default_factory=lambda: float(_env("ATTEST_EVERY", "60")))
    promotion_every_s: float = field(default_factory=lambda: float(_env("PROMOTION_EVERY", "10")))
    # How often each project's retention_days is applied (storage/retention.py); 0: never (run it by hand).
    retention_every_s: float = field(default_factory=lambda: float(_env("RETENTION_EVERY", "3600")))
    # Whether this process runs the housekeeping jobs (storage/housekeep.py: the feedback sweep every
    # reconcile_every_s, retention and change-log pruning every retention_every_s) in a thread of its own;
    # 0 (``serve --no-housekeep``) when ``onthejob housekeep`` runs them elsewhere.
    housekeep: bool = field(default_factory=lambda: _env("HOUSEKEEP", "1") not in ("0", "false", "no"))
    key_cache_ttl_s: float = 60.0
    # Per API key: sustained requests/s and burst; 0 turns rate limiting off (it never applies under --no-auth).
    rate_limit_rps: float = field(default_factory=lambda: float(_env("RATE_LIMIT_RPS", "50")))
    rate_limit_burst: int = field(default_factory=lambda: int(_env("RATE_LIMIT_BURST", "100")))
    # While another host is live, write each recorded call's link keys to the database at once for the other
    # hosts (proxy/link_feed.py); 0 (ONTHEJOB_LINK_FEED=0): they find a parent only once its row lands.
    link_feed: bool = field(default_factory=lambda: _env("LINK_FEED", "1") not in ("0", "false", "no"))
    # False only for benchmarks (the recording-off baseline): ONTHEJOB_RECORD=0.
    record: bool = field(default_factory=lambda: _env("RECORD", "1") not in ("0", "false", "no"))
    # An operator-chosen admin key of the default project, ensured at start (docker compose's .env).
    admin_key: str = field(default_factory=lambda: _env("ADMIN_KEY", ""))
    # Who may read /metrics and the API docs (/docs, /redoc, /openapi.json): "open" (anyone),
    # "admin" (an admin key of the default project: the operator's; any caller under --no-auth), "off".
    metrics_access: str = field(default_factory=lambda: _env("METRICS_ACCESS", "admin"))
    docs_access: str = field(default_factory=lambda: _env("DOCS_ACCESS", "admin"))

    def __post_init__(self) -> None:
        self.upstreams = [u.rstrip("/").removesuffix("/v1") for u in self.upstreams if u]
        if not self.upstreams:
            raise ValueError("at least one --upstream URL is needed, e.g. http://127.0.0.1:8001")
        if self.spool_full_policy not in ("refuse", "serve"):
            raise ValueError("ONTHEJOB_SPOOL_FULL_POLICY must be 'refuse' or 'serve'")
        for name in ("metrics_access", "docs_access"):
            if getattr(self, name) not in ACCESS:
                raise ValueError(f"ONTHEJOB_{name.upper()} must be one of {', '.join(ACCESS)}")
        self.spool_dir = Path(self.spool_dir)
        self.database_url = resolve_database_url(self.database_url)
        if self.admin_key and self.auth:
            check_chosen_secret(self.admin_key)
