"""Running one gateway process: listen, wait for SIGTERM, drain, exit.

Shutdown timeline (SIGTERM):
1. readiness fails at once (`/readyz` answers 503, `maskgate_ready` drops to 0);
2. the listener stays open `shutdown_delay_s` so load balancers stop sending new requests;
3. the listener closes; in-flight requests and streams get up to `shutdown_grace_s` to end;
4. whatever still runs is cancelled (closing its upstream connections), background tasks
   stop, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from collections.abc import Callable

from aiohttp import web

from maskgate.gateway.app import LEADER, create_admin_app, create_app, create_probe_app
from maskgate.gateway.clients.connections import GuardedRunner
from maskgate.gateway.cluster.leader import Cluster, start_leader_sites
from maskgate.gateway.config import GatewayConfig
from maskgate.gateway.state import STATE, Resolver

LOG = logging.getLogger("maskgate")


async def _start_site(runner: web.AppRunner, host: str, port: int, reuse_port: bool) -> int:
    """Start listening; returns the bound port (the real one when `port` is 0)."""
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    return int(runner.addresses[-1][1])


async def serve(
    config: GatewayConfig,
    *,
    reuse_port: bool = False,
    resolver: Resolver | None = None,
    on_listening: Callable[[int], None] | None = None,
    cluster: Cluster | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then drain (see the module docstring)."""
    app = create_app(config, resolver=resolver, cluster=cluster)
    guard = app[STATE].connections
    assert guard is not None
    guard.max_connections = _connection_cap(config.clients.max_connections)
    runner = GuardedRunner(
        app,
        guard,
        handler_cancellation=True,  # a client that hangs up cancels its upstream request
        shutdown_timeout=config.shutdown_grace_s,
        access_log=None,  # our own JSON access log replaces aiohttp's
    )
    await runner.setup()
    port = await _start_site(runner, config.host, config.port, reuse_port)
    probe_runner = None
    if config.metrics_port is not None:
        # The same guard: the cap and the timeouts cover both listeners together.
        probe_runner = GuardedRunner(create_probe_app(app), guard, access_log=None)
        await probe_runner.setup()
        mport = await _start_site(probe_runner, config.host, config.metrics_port, reuse_port)
        LOG.info("metrics listening", extra={"host": config.host, "port": mport})
    admin_runner = None
    if config.admin_port is not None:  # loopback only (config.py checks admin_host)
        admin_runner = GuardedRunner(create_admin_app(app), guard, access_log=None)
        await admin_runner.setup()
        aport = await _start_site(admin_runner, config.admin_host, config.admin_port, reuse_port)
        LOG.info("admin listening", extra={"host": config.admin_host, "port": aport})
    lead = app.get(LEADER)
    leader_runner = None
    if lead is not None:  # the control leader (leader.py)
        leader_runner = await start_leader_sites(lead, runner, admin_runner)
    LOG.info("listening", extra={"host": config.host, "port": port})
    for name, pool in app[STATE].pools.items():
        if not pool.endpoints and pool.cfg.dns is None:
            LOG.warning(
                "pool %s has no endpoints: its requests get 503 until some are added "
                "(config, DNS or POST /admin/pools/%s/endpoints)",
                name,
                name,
                extra={"pool": name},
            )
    if on_listening is not None:
        on_listening(port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    state = app[STATE]
    state.draining = True
    LOG.info(
        "draining",
        extra={"delay_s": config.shutdown_delay_s, "grace_s": config.shutdown_grace_s},
    )
    if config.shutdown_delay_s > 0:
        await asyncio.sleep(config.shutdown_delay_s)
    await runner.cleanup()  # closes the listener, waits for in-flight work, stops tasks
    if probe_runner is not None:
        await probe_runner.cleanup()
    if admin_runner is not None:
        await admin_runner.cleanup()
    if leader_runner is not None:
        await leader_runner.cleanup()
    LOG.info("stopped")


def _connection_cap(wanted: int) -> int:
    """`max_connections`, lowered to 3/4 of the open-file limit (after raising the soft
    limit to the hard one) so that upstream connections and files keep fds to spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(16, soft * 3 // 4)
    if cap < wanted:
        LOG.warning(
            "clients.max_connections lowered to %d: the open-file limit is %d (raise "
            "`ulimit -n` to allow more)",
            cap,
            soft,
            extra={"max_connections": cap, "nofile": soft},
        )
        return cap
    return wanted


def run(config: GatewayConfig, *, reuse_port: bool = False, cluster: Cluster | None = None) -> None:
    """Blocking entry point for one process; uses uvloop when it is installed."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(config, reuse_port=reuse_port, cluster=cluster))
