"""The gateway's one typed configuration (docs/design.md, Pools).

Built only through `gateway.settings.load_settings` (YAML file < `MASKGATE_*` environment <
CLI flags), validated once at start. Every model forbids unknown keys, so a misspelt option
stops the start with an error that names it instead of being silently ignored.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from maskgate.protocol.engine_rules import ENGINE_MASK_CAP
from maskgate.protocol.policy_settings import PolicySettings

POOL_NAMES = ("general", "mask")


def normalize_endpoint(url: str) -> str:
    """`http://host:port` with no path and no trailing slash; raises ValueError otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"endpoint {url!r} has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"endpoint {url!r} must not carry a path, query or fragment")
    try:
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError as e:
        raise ValueError(f"endpoint {url!r} has an invalid port") from e
    return f"{parts.scheme}://{parts.netloc}"


EndpointUrl = Annotated[str, AfterValidator(normalize_endpoint)]
PositiveFloat = Annotated[float, Field(gt=0)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeoutsConfig(StrictModel):
    """Seconds. There is no total timeout: a stream may run as long as tokens keep coming."""

    connect_s: PositiveFloat = 2.0  # TCP connect to an upstream
    # Request sent -> response headers (a non-streaming LLM answer arrives whole, so this
    # bounds the whole generation) and, for streams, headers -> first chunk.
    ttfb_s: PositiveFloat = 600.0
    idle_s: PositiveFloat = 120.0  # longest gap between two chunks of a streamed body
    health_interval_s: PositiveFloat = 5.0
    health_timeout_s: PositiveFloat = 2.0


class ClientsConfig(StrictModel):
    """Bounds on the connections clients open to the gateway, per process (connections.py).
    Seconds."""

    header_timeout_s: PositiveFloat = 10.0  # first byte of a request head -> its end (408)
    body_timeout_s: PositiveFloat = 30.0  # longest silence while a request body is read (408)
    body_deadline_s: PositiveFloat = 120.0  # a whole request body, from its head's end (408)
    idle_timeout_s: PositiveFloat = 75.0  # a kept-alive connection with no request in progress
    # Open client connections. When full, a new one closes the longest-idle one; with none
    # idle it gets 503 `too_many_connections`. Lowered at start to 3/4 of the open-file
    # limit (`ulimit -n`) when that is smaller, so new clients are never reset for want of fds.
    max_connections: int = Field(default=10000, ge=1)


class RetriesConfig(StrictModel):
    """Retries happen only before the first byte reaches the client, on connect errors and
    502/503/504, each to another endpoint."""

    max_attempts: int = Field(default=3, ge=1)  # total attempts, including the first
    backoff_base_s: float = Field(
        default=0.025, ge=0
    )  # delay before retry n: base * 2**(n-1), jittered
    backoff_max_s: float = Field(default=0.5, ge=0)


class CircuitConfig(StrictModel):
    """Per endpoint. Failures are connect errors, timeouts and 5xx answers other than 503;
    4xx, 429 and 503 answers are not endpoint faults and are never counted."""

    failure_threshold: int = Field(default=5, ge=1)  # consecutive failures that open the circuit
    open_s: PositiveFloat = 10.0  # open -> half-open after this long; one probe request then


class PoolConfig(StrictModel):
    endpoints: list[EndpointUrl] = Field(default_factory=list)
    # DNS discovery: every A/AAAA address of `dns` becomes `{dns_scheme}://addr:{dns_port}`.
    dns: str | None = None
    dns_port: int = Field(default=30000, ge=1, le=65535)
    dns_scheme: Literal["http", "https"] = "http"
    dns_interval_s: PositiveFloat = 10.0
    # Admission (rule 10): requests past `max_concurrency` wait in a FIFO queue of at most
    # `max_queue` for at most `queue_timeout_s`.
    max_concurrency: int = Field(default=1024, ge=1)
    max_queue: int = Field(default=4096, ge=0)
    queue_timeout_s: PositiveFloat = 30.0
    # Active health checks: GET `health_path`; null disables them (and passive ejection).
    health_path: str | None = "/health"
    unhealthy_threshold: int = Field(default=3, ge=1)
    healthy_threshold: int = Field(default=2, ge=1)
    circuit: CircuitConfig = Field(default_factory=CircuitConfig)
    # What the pool's endpoints run (protocol/engine_rules.py): maskgate workers serve every
    # mask the policy admits; SGLang serves masks only with top_k <= sampling_mask_max_tokens
    # (SGLang's --sampling-mask-max-tokens) and answers them as lists.
    engine: Literal["maskgate", "sglang"] = "maskgate"
    sampling_mask_max_tokens: int = Field(default=ENGINE_MASK_CAP, ge=1)

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.health_path is not None and not self.health_path.startswith("/"):
            raise ValueError("health_path must start with '/'")
        if len(set(self.endpoints)) != len(self.endpoints):
            raise ValueError("endpoints must not repeat")
        return self


class PoolsConfig(StrictModel):
    general: PoolConfig = Field(default_factory=PoolConfig)
    mask: PoolConfig = Field(
        default_factory=lambda: PoolConfig(max_concurrency=256, max_queue=1024)
    )


class ControlSettings(StrictModel):
    """The RL control plane (docs/rl.md): which pool the trainer's control calls act on, and
    how a fleet-wide weight sync waits on its endpoints."""

    # The control plane (RL control and worker registration on the traffic port). null:
    # on wherever it can be secured (`GatewayConfig.control_enabled`); true: on, and the
    # start fails where it cannot be; false: off (its paths answer 404).
    enabled: bool | None = None
    trained_pool: Literal["general", "mask"] = "mask"
    # A weight update sent with no pause before it: "none" (SGLang's default for an update)
    # holds only new requests while it runs and leaves in-flight ones running; "abort",
    # "retract" or "in_place" pause every endpoint with that SGLang mode first ("abort" ends
    # in-flight requests with finish_reason abort) and continue them after.
    pause_mode: Literal["none", "abort", "retract", "in_place"] = "none"
    # /flush_cache answers 400 while requests are still running: retried this often, this far
    # apart (seconds), before the endpoint counts as failed.
    flush_attempts: int = Field(default=60, ge=1)
    flush_interval_s: float = Field(default=1.0, ge=0)
    # Seconds one control call may take on one endpoint (a weight load, or an init that waits
    # for the trainer to join the process group).
    timeout_s: PositiveFloat = 600.0
    # The longest any hold of the pool (a sync, a pause, a memory release) may last; then the
    # pool is released (holds.py). Longer than the trainer's longest step between a pause
    # or release and its continue or resume.
    hold_deadline_s: PositiveFloat = 3600.0


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as e:
        raise ValueError(f"{value!r} is not an IP address or CIDR network") from e
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback(host: str) -> str:
    if not _is_loopback(host):
        raise ValueError(f"admin_host must be a loopback address (127.0.0.1, ::1), not {host!r}")
    return host


class OffloadConfig(StrictModel):
    """Inference bodies checked in worker processes, off the event loop (bodycheck.py)."""

    # Bodies larger than this (bytes, after Content-Encoding decoding); null: never by size.
    min_bytes: int | None = Field(default=1024 * 1024, ge=0)
    min_items: int = Field(default=256, ge=1)  # mask requests with more prompts than this
    workers: int = Field(default=1, ge=1, le=64)  # processes, started on first use


class GatewayConfig(StrictModel):
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    # None: /healthz, /readyz and /metrics on `port`. Else /metrics moves to this port
    # (probes answer on both).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # Processes sharing `port` (SO_REUSEPORT). `auto`: one per CPU this process may use, the
    # cgroup CPU quota included (processes/cores.py); one when `port` is 0 (nothing to share).
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = "auto"
    api_keys: list[str] = Field(default_factory=list)  # empty: no client authentication
    # None: any authenticated caller may ask for masks. Else only these keys (rule 2).
    mask_allow_keys: list[str] | None = None
    # The admin API is off unless `admin_key` is set (then it answers on `port`, key
    # required) or `admin_port` opens a listener on the loopback-only `admin_host` (no key
    # needed there unless `admin_key` is set).
    admin_key: str | None = None
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    admin_host: Annotated[str, AfterValidator(_loopback)] = "127.0.0.1"
    # Admin-added endpoint URLs with credentials, or whose host is (or resolves to) a
    # link-local or cloud-metadata address, are refused unless this is true.
    admin_allow_unsafe_urls: bool = False
    # Peers (IP addresses or CIDR networks) whose X-Forwarded-For / Forwarded / X-Real-IP
    # are kept and extended; from anyone else these headers are dropped.
    trusted_proxies: list[Annotated[str, AfterValidator(_network)]] = Field(default_factory=list)
    upstream_api_key: str | None = None  # sent upstream as `Authorization: Bearer ...`
    # Sent instead on control calls to workers (their `--admin-api-key`); null: upstream_api_key.
    upstream_admin_api_key: str | None = None
    # Callers (IP addresses or CIDR networks) that reach the control plane and registration
    # without the admin key (access.py).
    trusted_networks: list[Annotated[str, AfterValidator(_network)]] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"]
    )
    # The control plane open to every caller, keys or not (logged as a warning at start).
    insecure_control: bool = False
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    # The largest upstream answer the gateway reads whole (a non-streamed answer, a control
    # reply); past it, 502 `upstream_answer_too_large`. Streams are relayed, never buffered.
    max_upstream_answer_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # SIGTERM: readiness fails at once; the listener stays open `shutdown_delay_s` (so load
    # balancers notice), then in-flight requests get `shutdown_grace_s` to finish.
    shutdown_delay_s: float = Field(default=0.0, ge=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    retries: RetriesConfig = Field(default_factory=RetriesConfig)
    pools: PoolsConfig = Field(default_factory=PoolsConfig)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    control: ControlSettings = Field(default_factory=ControlSettings)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True  # one JSON line per proxied request (at info level)

    @model_validator(mode="after")
    def _check(self) -> GatewayConfig:
        if any(not k for k in self.api_keys):
            raise ValueError("api_keys must not contain empty keys")
        if self.mask_allow_keys is not None and self.api_keys:
            unknown = set(self.mask_allow_keys) - set(self.api_keys)
            if unknown:
                raise ValueError("mask_allow_keys must be a subset of api_keys")
        if self.mask_allow_keys is not None and not self.api_keys:
            raise ValueError("mask_allow_keys needs api_keys (callers must authenticate)")
        if self.workers != "auto" and self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 needs a fixed port (the processes share it)")
        if self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError("metrics_port must differ from port")
        if self.admin_port not in (None, 0) and self.admin_port in (self.port, self.metrics_port):
            raise ValueError("admin_port must differ from port and metrics_port")
        if self.admin_key == "":
            raise ValueError("admin_key must not be empty")
        if "" in (self.upstream_api_key, self.upstream_admin_api_key):
            raise ValueError("upstream_api_key and upstream_admin_api_key must not be empty")
        if self.control.enabled and not (self.control_securable() or self.insecure_control):
            raise ValueError(
                f"control.enabled is true, but the control plane cannot be secured: the "
                f"gateway listens on {self.host}, with no admin_key and no trusted_networks "
                "outside loopback. Set admin_key, or add the trainer's network to "
                "trusted_networks, or set insecure_control: true (then anyone who reaches "
                "the port may update weights and register workers), or control.enabled: false"
            )
        return self

    def control_securable(self) -> bool:
        """Whether something keeps strangers off the control plane: a loopback listener,
        the admin key, or a trusted network beyond loopback."""
        return (
            _is_loopback(self.host)
            or self.admin_key is not None
            or any(
                not ipaddress.ip_network(n, strict=False).is_loopback for n in self.trusted_networks
            )
        )

    def control_enabled(self) -> bool:
        """Whether the control plane's rows are served (`control.enabled`, resolved)."""
        if self.control.enabled is not None:
            return self.control.enabled
        return self.control_securable() or self.insecure_control
