"""Lock-free counters and histograms for metrics updated on every request.

prometheus_client's types are built for threads and take a lock on every update, several
per histogram observation; on the request path that came to about a tenth of the gateway's
own CPU per request. The gateway updates these metrics only from its event-loop thread and
is scraped from that same thread, so plain integer and float updates are enough. The text
format is the same as prometheus_client's Counter and Histogram.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, matching Prometheus' `le` buckets.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_counts(self, counts: Mapping[int, int] | Mapping[float, int]) -> None:
        """`n` observations of `value` for each item: one bucket lookup per distinct value."""
        for value, n in counts.items():
            self.counts[bisect_left(self.bounds, value)] += n
            self.sum += value * n


class LoopCounter(Collector):
    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        assert len(values) == len(self.labelnames), self.labelnames
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(list(values), child.value)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.doc, labels=self.labelnames)


class LoopHistogram(Collector):
    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        assert list(self.bounds) == sorted(set(self.bounds)), "buckets must increase"
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        assert len(values) == len(self.labelnames), self.labelnames
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            buckets, total = [], 0
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                total += count
                buckets.append((floatToGoString(bound), total))
            family.add_metric(list(values), buckets, child.sum)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
