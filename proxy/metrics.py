"""Prometheus metrics, one registry per app (no import-time globals).

Every call is observed once, when it ends (:meth:`Metrics.observe_call`; a call refused
before it reached the engine: :meth:`Metrics.observe_refusal`), by route (``chat``,
``completions``), dialect (the API the client spoke), HTTP status and termination.
Label children are cached: ``labels()`` costs more than the increment it feeds.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        call = ["route", "dialect"]
        self.requests = Counter("onthejob_requests", "Calls answered", [*call, "status", "termination"], registry=r)
        self.terminations = Counter("onthejob_terminations", "Recorded calls by termination", ["reason"], registry=r)
        self.records_spooled = Counter("onthejob_records_spooled", "Records fsync'd to the spool", registry=r)
        self.records_written = Counter("onthejob_records_written", "Records committed to the database", registry=r)
        self.records_dropped = Counter(
            "onthejob_records_dropped", "Records served but not recorded (must stay 0)", ["reason"], registry=r
        )
        self.spool_full_rejections = Counter(
            "onthejob_spool_full_rejections", "Calls refused because the spool is full", registry=r
        )
        self.spool_depth = Gauge("onthejob_spool_depth", "Records in the spool, not yet in the database", registry=r)
        self.spool_age = Gauge("onthejob_spool_oldest_age_seconds", "Age of the oldest spooled record", registry=r)
        self.spool_bytes = Gauge("onthejob_spool_bytes", "Bytes on disk in the spool", registry=r)
        self.db_up = Gauge("onthejob_db_up", "1 if the last database write succeeded", registry=r)
        # Engine replicas (proxy/replicas.py): the gauges are set when /metrics is read.
        self.upstream_up = Gauge("onthejob_upstream_up", "1 while the replica is in rotation", ["upstream"], registry=r)
        self.upstream_inflight = Gauge(
            "onthejob_upstream_inflight", "Calls this worker has in flight on the replica", ["upstream"], registry=r
        )
        self.upstream_adapters = Gauge(
            "onthejob_upstream_adapters", "Adapter versions the replica lists", ["upstream"], registry=r
        )
        self.upstream_failures = Counter(
            "onthejob_upstream_failures",
            "Calls that failed on a replica before its reply began (refused: no connection; http_5xx)",
            ["upstream", "kind"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "onthejob_upstream_retries",
            "Calls sent again (refused: on another replica; adapter_missing: after loading the adapter)",
            ["reason"],
            registry=r,
        )
        buckets = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120)
        self.latency = Histogram("onthejob_request_seconds", "Time to the last byte", call, registry=r, buckets=buckets)
        self.ttft = Histogram(
            "onthejob_time_to_first_token_seconds",
            "Time to the first chunk (streams) or to the whole reply",
            call,
            registry=r,
            buckets=buckets,
        )
        self.tokens = Counter("onthejob_tokens", "Tokens in answered calls", [*call, "kind"], registry=r)
        self.feedback_orphans = Gauge(
            "onthejob_feedback_orphans", "Pending feedback older than its TTL (target never landed)", registry=r
        )
        self.ambiguous_links = Counter(
            "onthejob_ambiguous_links",
            "Calls whose prefix matched more than one live session: started a new one (ambiguous_link)",
            registry=r,
        )
        self.adapter_loads = Counter("onthejob_adapter_loads", "Adapter loads into engines", ["result"], registry=r)
        self.adapter_unloads = Counter(
            "onthejob_adapter_unloads", "Unneeded adapter versions unloaded from engines", ["result"], registry=r
        )
        self.promotion_decisions = Counter(
            "onthejob_promotion_decisions", "Promotion decisions by kind", ["decision"], registry=r
        )
        self.attestation_failures = Counter(
            "onthejob_attestation_failures",
            "Replica probes that did not match the attested fingerprint",
            ["alias"],
            registry=r,
        )
        self._terminations: dict[str, Any] = {}
        self._calls: dict[tuple[str, ...], tuple[Any, ...]] = {}

    def termination(self, reason: str) -> Any:
        """The per-reason child of ``terminations`` (``labels()`` costs more than the increment; once per call)."""
        child = self._terminations.get(reason)
        if child is None:
            child = self._terminations[reason] = self.terminations.labels(reason)
        return child

    def observe_call(
        self,
        route: str,
        dialect: str,
        status: int,
        termination: str,
        seconds: float,
        ttft_s: float | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> None:
        """One call that reached the engine (or tried to), as it ended."""
        key = (route, dialect, str(status), termination)
        children = self._calls.get(key)
        if children is None:
            children = self._calls[key] = (
                self.requests.labels(*key),
                self.latency.labels(route, dialect),
                self.ttft.labels(route, dialect),
                self.tokens.labels(route, dialect, "prompt"),
                self.tokens.labels(route, dialect, "completion"),
            )
        requests, latency, ttft, prompt, completion = children
        requests.inc()
        latency.observe(seconds)
        if ttft_s is not None:
            ttft.observe(ttft_s)
        if prompt_tokens:
            prompt.inc(prompt_tokens)
        if completion_tokens:
            completion.inc(completion_tokens)

    def observe_refusal(self, route: str, dialect: str, status: int) -> None:
        """A call refused before it reached the engine (key, body, rate limit, spool full): counted, not timed."""
        key = (route, dialect, str(status), "refused")
        children = self._calls.get(key)
        if children is None:
            children = self._calls[key] = (self.requests.labels(*key),)
        children[0].inc()
