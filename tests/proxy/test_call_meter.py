"""The per-call series, kept as plain numbers, read exactly as prometheus_client's own objects would have."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from proxy.call_meter import BUCKETS, CALL
from proxy.metrics import Metrics

# route, dialect, status, termination, seconds, ttft, prompt tokens, completion tokens
CALLS = [
    ("chat", "chat", 200, "length", 0.0123, 0.01, 16, 5),
    ("chat", "chat", 200, "length", 1.0, None, 16, 5),  # on a bucket's bound: counted in it
    ("chat", "chat", 200, "stop", 0.001, 0.001, None, 5),
    ("chat", "responses", 502, "upstream_error", 130.0, None, None, None),  # past the last bound: +Inf only
    ("completions", "completions", 200, "length", 0.2, 0.05, 3, 0),
]


def _reference() -> str:
    r = CollectorRegistry()
    requests = Counter("onthejob_requests", "Calls answered", [*CALL, "status", "termination"], registry=r)
    terminations = Counter("onthejob_terminations", "Recorded calls by termination", ["reason"], registry=r)
    latency = Histogram("onthejob_request_seconds", "Time to the last byte", CALL, registry=r, buckets=BUCKETS)
    ttft = Histogram(
        "onthejob_time_to_first_token_seconds",
        "Time to the first chunk (streams) or to the whole reply",
        CALL,
        registry=r,
        buckets=BUCKETS,
    )
    tokens = Counter("onthejob_tokens", "Tokens in answered calls", [*CALL, "kind"], registry=r)
    for route, dialect, status, termination, seconds, ttft_s, prompt, completion in CALLS:
        requests.labels(route, dialect, str(status), termination).inc()
        terminations.labels(termination).inc()
        latency.labels(route, dialect).observe(seconds)
        if ttft_s is not None:
            ttft.labels(route, dialect).observe(ttft_s)
        if prompt:
            tokens.labels(route, dialect, "prompt").inc(prompt)
        if completion:
            tokens.labels(route, dialect, "completion").inc(completion)
    requests.labels("chat", "chat", "401", "refused").inc()
    return generate_latest(r).decode()


def _call_series(exposition: str) -> list[str]:
    """The lines of the five per-call families (their ``_created`` samples aside: the meter has none)."""
    names = (
        "onthejob_requests",
        "onthejob_terminations",
        "onthejob_request_seconds",
        "onthejob_time_to_first_token_seconds",
        "onthejob_tokens",
    )
    return sorted(
        line for line in exposition.splitlines() if any(name in line for name in names) and "_created" not in line
    )


def test_the_meter_exposes_what_prometheus_client_objects_would() -> None:
    metrics = Metrics()
    for call in CALLS:
        metrics.observe_call(*call)
    metrics.observe_refusal("chat", "chat", 401)
    ours = _call_series(generate_latest(metrics.registry).decode())
    assert ours == _call_series(_reference())
    # 0.0123 s, 1.0 s and 0.001 s: all three chat calls at or under the 1 s bound
    assert 'onthejob_request_seconds_bucket{dialect="chat",le="1.0",route="chat"} 3.0' in ours
