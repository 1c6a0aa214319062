"""Endpoint selection, pool membership, health thresholds and retry backoff."""

from __future__ import annotations

import random

from maskgate.gateway.config import PoolConfig
from maskgate.gateway.observability.metrics import GatewayMetrics
from maskgate.gateway.pools.health import record_check
from maskgate.gateway.pools.pool import Pool, choose
from maskgate.gateway.proxy.handler import _backoff


def make_pool(urls: list[str], **cfg) -> Pool:
    return Pool(
        "general", PoolConfig(endpoints=urls, **cfg), GatewayMetrics(), rng=random.Random(0)
    )


def test_choose_prefers_fewer_outstanding_and_skips_unusable():
    pool = make_pool(["http://a:1", "http://b:1", "http://c:1"])
    a, b, c = pool.endpoints
    a.outstanding, b.outstanding, c.outstanding = 5, 0, 9
    picks = [pool.endpoints[choose(pool.endpoints, (), random.Random(i))] for i in range(50)]
    assert c not in picks or picks.count(c) < picks.count(b)
    assert a in picks or b in picks
    # Power of two choices never picks the busiest of three.
    assert all(p is not c for p in picks)
    b.healthy = False
    assert {pool.pick() for _ in range(20)} <= {a, c}
    c.circuit.record_failure()
    for _ in range(5):
        c.circuit.record_failure()
    assert {pool.pick() for _ in range(20)} == {a}
    assert pool.pick(exclude=[a]) is None
    assert not make_pool([]).has_usable()


def test_single_endpoint_fast_path():
    pool = make_pool(["http://a:1"])
    [a] = pool.endpoints
    assert pool.pick() is a and pool.pick([a]) is None
    a.healthy = False
    assert pool.pick() is None


def test_add_remove_and_metrics_series():
    pool = make_pool(["http://a:1"])
    assert pool.add("http://a:1", "admin") is None
    b = pool.add("http://b:1", "dns")
    assert b is not None and [e.url for e in pool.endpoints] == ["http://a:1", "http://b:1"]
    text = pool.metrics.render().decode()
    assert 'maskgate_upstream_healthy{pool="general",upstream="http://b:1"} 1.0' in text
    assert pool.remove("http://b:1") is b and b.removed
    assert pool.remove("http://b:1") is None
    assert 'upstream="http://b:1"' not in pool.metrics.render().decode()
    assert 'maskgate_pool_endpoints{pool="general"} 1.0' in pool.metrics.render().decode()


def test_health_thresholds():
    cfg = PoolConfig(unhealthy_threshold=3, healthy_threshold=2)
    pool = make_pool(["http://a:1"])
    [ep] = pool.endpoints
    assert ep.healthy is None and ep.usable()  # unknown until the first check
    assert record_check(ep, True, cfg) and ep.healthy is True  # the first answer decides
    assert not record_check(ep, False, cfg) and not record_check(ep, False, cfg)
    assert ep.healthy is True
    record_check(ep, True, cfg)  # a pass resets the failure run
    record_check(ep, False, cfg)
    record_check(ep, False, cfg)
    assert record_check(ep, False, cfg) and ep.healthy is False
    assert not record_check(ep, True, cfg)
    assert record_check(ep, True, cfg) and ep.healthy is True


def test_health_unchecked_pool_is_always_healthy():
    pool = make_pool(["http://a:1"], health_path=None)
    assert pool.endpoints[0].healthy is True


def test_backoff_is_capped_exponential_with_jitter():
    for attempt in range(1, 10):
        d = _backoff(attempt, 0.01, 0.1)
        full = min(0.1, 0.01 * 2 ** (attempt - 1))
        assert full / 2 <= d <= full


def test_refused_connections_eject_but_connect_timeouts_only_count():
    from types import SimpleNamespace

    from maskgate.gateway.proxy.handler import _connect_failure
    from maskgate.gateway.upstream.http1 import ConnectError

    pool = make_pool(["http://a:1", "http://b:1"])
    a, b = pool.endpoints
    state = SimpleNamespace(metrics=pool.metrics)  # all _connect_failure reads of the state
    err = _connect_failure(state, pool, a, ConnectError("refused"))
    assert err is not None and err.code == "upstream_unreachable"
    assert a.healthy is False  # the process is gone: out of rotation until health checks pass
    err = _connect_failure(state, pool, b, ConnectError("timed out", timed_out=True))
    assert err is not None and err.code == "upstream_unreachable"  # still retried elsewhere
    assert b.healthy is not False  # a slow accept under load is left to the circuit breaker
