"""Prometheus metrics, one registry per app (no import-time globals).

Every call is observed once, when it ends (:meth:`Metrics.observe_call`; a call refused
before it reached the engine: :meth:`Metrics.observe_refusal`), by route (``chat``,
``completions``), dialect (the API the client spoke), HTTP status and termination:
those series are plain numbers until scraped (proxy/call_meter.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.call_meter import CallMeter


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.calls = CallMeter()  # every call's series: plain numbers, exported when scraped
        r.register(self.calls)
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
        self.calls.call(route, dialect, status, termination, seconds, ttft_s, prompt_tokens, completion_tokens)

    def observe_refusal(self, route: str, dialect: str, status: int) -> None:
        """A call refused before it reached the engine (key, body, rate limit, spool full): counted, not timed."""
        self.calls.refusal(route, dialect, status)
