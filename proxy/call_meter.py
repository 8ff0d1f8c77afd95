"""The per-call series of ``/metrics``, kept as plain numbers and turned into Prometheus families when scraped.

Every call adds to six series as it ends (calls, terminations, latency, time to first
token, prompt and completion tokens). Through ``prometheus_client`` each is a child
object whose increment takes a lock and checks it may be observed: 8.5 µs a call on the
serving loop under load, measured in place (bench/journal/2026-12-02.md, the `CallMeter` table), more than building the
call's whole database record. Here a call is a few dictionary and list updates on
the event loop, the only writer; :meth:`CallMeter.collect` reads them at scrape time.
Names, labels and buckets are those the ``Counter`` and ``Histogram`` objects had. The count of
records spooled is the spool's own, copied in when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

CALL = ["route", "dialect"]
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120)


class Histogram:
    """One label set's buckets (each value counted in the first bucket whose bound it does not exceed) and sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(BUCKETS, value)] += 1
        self.sum += value


class CallMeter(Collector):
    """Calls by route, dialect, status and termination; their times and tokens."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str, str], int] = {}
        self.terminations: dict[str, int] = {}
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.ttft: dict[tuple[str, str], Histogram] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.spooled = 0  # records fsync'd to the spool: its own count (``Spool.appended``), set when scraped
        self.link_lookups: dict[str, int] = {}  # where parents were found (``Linker.lookups``), set when scraped
        self.link_waited: dict[str, float] = {}  # seconds waited for them (``Linker.waited``), set when scraped

    def call(
        self,
        route: str,
        dialect: str,
        status: int,
        termination: str,
        seconds: float,
        ttft_s: float | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """One call that reached the engine (or tried to), as it ended."""
        key = (route, dialect, str(status), termination)
        self.requests[key] = self.requests.get(key, 0) + 1
        self.terminations[termination] = self.terminations.get(termination, 0) + 1
        pair = (route, dialect)
        latency = self.latency.get(pair)
        if latency is None:
            latency = self.latency[pair] = Histogram()
        latency.observe(seconds)
        if ttft_s is not None:
            ttft = self.ttft.get(pair)
            if ttft is None:
                ttft = self.ttft[pair] = Histogram()
            ttft.observe(ttft_s)
        if prompt_tokens:
            self._add_tokens((route, dialect, "prompt"), prompt_tokens)
        if completion_tokens:
            self._add_tokens((route, dialect, "completion"), completion_tokens)

    def refusal(self, route: str, dialect: str, status: int) -> None:
        """A call refused before it reached the engine: counted, not timed."""
        key = (route, dialect, str(status), "refused")
        self.requests[key] = self.requests.get(key, 0) + 1

    def _add_tokens(self, key: tuple[str, str, str], n: int) -> None:
        self.tokens[key] = self.tokens.get(key, 0) + n

    def collect(self) -> Iterator[Metric]:
        # list(): a scrape served off the loop must not see a dictionary change size under it
        requests = CounterMetricFamily("onthejob_requests", "Calls answered", labels=[*CALL, "status", "termination"])
        for call, n in list(self.requests.items()):
            requests.add_metric(list(call), n)
        terminations = CounterMetricFamily("onthejob_terminations", "Recorded calls by termination", labels=["reason"])
        for reason, n in list(self.terminations.items()):
            terminations.add_metric([reason], n)
        tokens = CounterMetricFamily("onthejob_tokens", "Tokens in answered calls", labels=[*CALL, "kind"])
        for kind, n in list(self.tokens.items()):
            tokens.add_metric(list(kind), n)
        spooled = CounterMetricFamily("onthejob_records_spooled", "Records fsync'd to the spool", value=self.spooled)
        lookups = CounterMetricFamily(
            "onthejob_link_lookups",
            "Calls with an earlier assistant turn, by where "
            "their parent was found (memory, spool, database, link_entry, none, "
            "believed_none, database_down, database_quiet)",
            labels=["found_in"],
        )
        for found_in, n in list(self.link_lookups.items()):
            lookups.add_metric([found_in], n)
        waited = CounterMetricFamily(
            "onthejob_link_wait_seconds",
            "Seconds calls waited for a parent another host answered, by where it was found "
            "(database, link_entry, none)",
            labels=["found_in"],
        )
        for found_in, seconds in list(self.link_waited.items()):
            waited.add_metric([found_in], seconds)
        yield from (requests, terminations, tokens, spooled, lookups, waited)
        yield _histogram("onthejob_request_seconds", "Time to the last byte", self.latency)
        yield _histogram(
            "onthejob_time_to_first_token_seconds", "Time to the first chunk (streams) or to the whole reply", self.ttft
        )


def _histogram(name: str, documentation: str, series: dict[tuple[str, str], Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=CALL)
    bounds = [*(str(float(b)) for b in BUCKETS), "+Inf"]
    for labels, hist in list(series.items()):
        counts, total = list(hist.counts), hist.sum
        cumulative, running = [], 0
        for bound, n in zip(bounds, counts, strict=True):
            running += n
            cumulative.append((bound, running))
        family.add_metric(list(labels), cumulative, total)
    return family
