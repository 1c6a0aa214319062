"""The worker's Prometheus metrics, declared in one place on a per-app registry.

The names are a contract with the deploy manifests (alerts, dashboard, autoscaling): change
them only together. Tokens/s is `rate(maskgate_worker_generated_tokens_total[1m])`.
The engine thread updates them; prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STEP_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 0.01, 0.025, 0.05, 0.1, 0.5)
_KERNEL_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.25)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.waiting = Gauge(
            "maskgate_worker_waiting_requests", "Sequences queued for a KV slot", registry=r
        )
        self.running = Gauge(
            "maskgate_worker_running_requests", "Sequences holding a KV slot", registry=r
        )
        self.batch_size = Histogram(
            "maskgate_worker_batch_size",
            "Rows per engine step (decode rows + prefill chunks)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter(
            "maskgate_worker_generated_tokens",
            "Output tokens committed",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "maskgate_worker_prompt_tokens", "Prompt tokens prefilled", registry=r
        )
        self.ttft = Histogram(
            "maskgate_worker_ttft_seconds",
            "Arrival to first output token, per sequence",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "maskgate_worker_itl_seconds",
            "Time between consecutive output tokens of a sequence",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.mask_overflows = Counter(
            "maskgate_worker_mask_overflows",
            "Exact-mode mask steps whose support exceeded max_mask_tokens (answered 400)",
            registry=r,
        )
        self.mask_kernel_seconds = Histogram(
            "maskgate_worker_mask_kernel_seconds",
            "Sampler (mask kernel) time per step that had mask rows",
            buckets=_KERNEL_BUCKETS,
            registry=r,
        )
        # Host-bound or device-bound: their ratio (docs/worker.md, "Step time and device wait").
        self.step_seconds = Histogram(
            "maskgate_worker_step_seconds",
            "Engine step time on its thread: schedule and launch a step, collect and"
            " post-process the step before it (overlap) or this one",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.device_wait_seconds = Histogram(
            "maskgate_worker_step_device_wait_seconds",
            "Of a step, the time the engine thread waited for the device's results (near 0"
            " when the host is the bottleneck, and on the CPU, which computes at launch)",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.sampler_fallback_rows = Counter(
            "maskgate_worker_sampler_fallback_rows",
            "Sampled rows the kernels' band could not decide (rescue or whole-row reads: wide"
            " supports, which hold a GPU step far longer than the rest)",
            registry=r,
        )
        self.kv_usage = Gauge(
            "maskgate_worker_kv_usage_ratio", "Fraction of KV slots in use", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
