"""The lock-free metric types export exactly what prometheus_client's own types would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from maskgate.gateway.observability.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [0.0, 0.0005, 0.001, 0.002, 0.01, 0.5, 1.0, 7.0, 0.1]


def exposition(registry: CollectorRegistry) -> list[str]:
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


def test_histogram_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopHistogram("x_seconds", "doc", ["pool"], BUCKETS, ours)
    b = Histogram("x_seconds", "doc", ["pool"], buckets=BUCKETS, registry=theirs)
    for v in VALUES:
        a.labels("mask").observe(v)
        b.labels("mask").observe(v)
    a.labels("general")  # a child with no observations yet
    b.labels("general")
    assert exposition(ours) == exposition(theirs)


def test_counter_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopCounter("x", "doc", ["route", "status"], ours)
    b = Counter("x", "doc", ["route", "status"], registry=theirs)
    for route, status in [("chat", "200"), ("chat", "200"), ("generate", "429")]:
        a.labels(route, status).inc()
        b.labels(route, status).inc()
    assert exposition(ours) == exposition(theirs)
