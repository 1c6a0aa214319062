"""Sampling a process tree's resident memory while load runs against it."""

from __future__ import annotations

import contextlib
import threading
import time

import psutil


def tree_rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / 2**20


class RssSampler:
    """Samples the summed RSS (MiB) of `procs` every `interval_s` in a background thread."""

    def __init__(self, procs: list[psutil.Process], interval_s: float) -> None:
        self.procs = procs
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            self.samples.append(
                (round(time.monotonic() - t0, 2), round(tree_rss_mib(self.procs), 2))
            )
            if self._stop.wait(self.interval_s):
                break

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        """Start and end (first and last minute's median), peak, and the slope (MiB/min)."""
        if len(self.samples) < 2:
            raise ValueError("RSS sampler ran too briefly to summarise")
        ts = [t for t, _ in self.samples]
        ms = [m for _, m in self.samples]
        span = ts[-1] - ts[0]
        window = min(60.0, span / 4)
        head = sorted(m for t, m in self.samples if t <= ts[0] + window)
        tail = sorted(m for t, m in self.samples if t >= ts[-1] - window)
        mt, mm = sum(ts) / len(ts), sum(ms) / len(ms)
        var = sum((t - mt) ** 2 for t in ts)
        slope = sum((t - mt) * (m - mm) for t, m in self.samples) / var if var else 0.0
        return {
            "seconds": round(span, 1),
            "start_mib": head[len(head) // 2],
            "end_mib": tail[len(tail) // 2],
            "peak_mib": max(ms),
            "slope_mib_per_min": round(slope * 60, 3),
        }
