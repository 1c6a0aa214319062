"""Control with several gateway processes on one port (`workers > 1`): one leader decides.

Process 0 of the supervisor is the control leader. It listens, besides its TCP port, on unix
sockets in a private directory the supervisor made (0700): `main.sock` (its traffic app),
`admin.sock` (its admin app, when `admin_port` is set) and `leader.sock` (the state below).

- Every row of the route table marked `forwarded_to_leader` (control, registration and
  admin paths) that reaches another process (a follower) is forwarded to the leader as it
  came (method, path, query, headers, body, plus the caller's address) and its answer
  relayed: the leader checks access,
  and there is one pool version, one stale set and one rank layout for the whole gateway.
  No leader answering: 503 `control_leader_unavailable`.
- Followers copy the leader's state (mirror.py) by long-polling `GET /state` on
  `leader.sock`; each poll carries the generation the follower last applied (its ack).
- Barrier: before the leader lets traffic reach a changed pool (after holding, before
  pausing endpoints; after a sync, before continuing them and before admitting again; after
  any control or registration call) it waits until every follower has applied the new
  generation, at most `_BARRIER_S` (then it logs and counts
  `maskgate_control_barrier_timeouts_total`).
- A follower holds the trained pool until its first copy. When the leader has not answered
  for `_LOST_S` it releases the leader's holds (keeping the stale set), except a trainer's
  pause or memory release: those endpoints cannot serve, so it keeps holding until the
  leader is back (or the hold's deadline, holds.py).
- The leader writes each generation to `state.json` there, so a restarted leader starts from
  its predecessor's versions, stale set, endpoints, groups and the trainer's holds (a pause
  survives a leader restart; the trainer's `/continue_generation` ends it). A sync hold is
  not taken over: its call died with the old leader; when that sync had paused the
  endpoints (a `pause_mode`), the new leader continues them.
- The state endpoint always answers a complete snapshot, a new leader's first one included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from maskgate.gateway.cluster import mirror
from maskgate.gateway.cluster.leader_middleware import LeaderPaths, add_barrier, add_forwarding
from maskgate.gateway.rl.holds import TRAINER_HOLDS, PoolControl
from maskgate.gateway.state import STATE, GatewayState

LOG = logging.getLogger("maskgate.leader")
_BARRIER_S = 2.0  # how long the leader waits for every follower to apply a change
_POLL_WAIT_S = 0.5  # a state poll with nothing new waits this long for a change
_LOST_S = 3.0  # a follower without an answer this long releases the leader's holds
_RETRY_S = 0.05  # between failed polls


@dataclass(frozen=True)
class Cluster:
    """Where this process stands among the supervisor's `count` processes."""

    directory: str
    index: int
    count: int

    @property
    def is_leader(self) -> bool:
        return self.index == 0

    def socket(self, name: str) -> str:
        return os.path.join(self.directory, name)


class Leader:
    """The leader's side: the published state, its generation, and the followers' acks."""

    def __init__(self, state: GatewayState, ctl: PoolControl, cluster: Cluster) -> None:
        self.state, self.ctl, self.cluster = state, ctl, cluster
        self.boot = os.urandom(8).hex()  # a restarted leader starts a new generation count
        self.generation = 0
        self.acks: dict[int, int] = {}  # follower index -> generation it applied
        self._last = b""
        self._changed = asyncio.Event()
        self._acked = asyncio.Event()

    def refresh(self) -> int:
        """The current generation, a new one when the state changed since the last."""
        raw = orjson.dumps(mirror.snapshot(self.state, self.ctl), option=orjson.OPT_SORT_KEYS)
        if raw != self._last:
            self._last = raw
            self.generation += 1
            path = self.cluster.socket("state.json")
            try:
                with open(path + ".tmp", "wb") as f:
                    f.write(raw)
                os.replace(path + ".tmp", path)
            except OSError:  # only a restarted leader reads it: never fail a call for it
                LOG.exception("could not save the control state")
            self._changed.set()
            self._changed = asyncio.Event()
        return self.generation

    async def barrier(self) -> None:
        gen = self.refresh()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _BARRIER_S
        while missing := [i for i in range(1, self.cluster.count) if self.acks.get(i, 0) < gen]:
            left = deadline - loop.time()
            if left <= 0:
                self.state.metrics.control_barrier_timeouts.inc()
                LOG.warning(
                    "gateway processes %s did not apply control generation %d within %g s",
                    missing,
                    gen,
                    _BARRIER_S,
                )
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), left)

    async def handle_state(self, request: web.Request) -> web.Response:
        """`GET /state?index=&boot=&generation=`: records the ack, answers at once when the
        follower is behind, else after the next change (at most `_POLL_WAIT_S`)."""
        q = request.query
        try:
            index, gen = int(q.get("index", "0")), int(q.get("generation", "0"))
        except ValueError:
            raise web.HTTPBadRequest(reason="index and generation must be integers") from None
        current = q.get("boot") == self.boot
        if index > 0:
            self.acks[index] = gen if current else 0
            self._acked.set()
            self._acked = asyncio.Event()
        # Always a fresh snapshot first: a new leader has published nothing yet.
        if self.refresh() <= gen and current:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), _POLL_WAIT_S)
            self.refresh()
        head = orjson.dumps({"boot": self.boot, "generation": self.generation})
        return web.Response(
            body=head[:-1] + b',"state":' + self._last + b"}", content_type="application/json"
        )


async def _restore(state: GatewayState, ctl: PoolControl, cluster: Cluster) -> bool:
    """Start from the state the previous leader saved; True when that leader died during a
    sync that had paused the endpoints (they need a continue)."""
    try:
        with open(cluster.socket("state.json"), "rb") as f:
            snap = orjson.loads(f.read())
    except FileNotFoundError:
        return False
    except (OSError, orjson.JSONDecodeError):
        LOG.exception("could not read the previous leader's state; starting fresh")
        return False
    await mirror.apply(state, ctl, snap, holds=False)
    held = set(snap.get("holds", ()))
    for reason in sorted(held & TRAINER_HOLDS):  # the trainer's pause or release goes on
        ctl.hold(reason)
    LOG.info(
        "control state restored from the previous leader",
        extra={"holds": sorted(held & TRAINER_HOLDS)},
    )
    # A sync that died with its leader may have left the endpoints paused for it.
    return "sync" in held and "paused" not in held and state.config.control.pause_mode != "none"


async def _continue_after_dead_sync(ctl: PoolControl) -> None:
    LOG.warning("the previous leader died during a sync; continuing the endpoints")
    try:
        if ctl.release is not None:
            await ctl.release("paused")
    except Exception:
        LOG.exception("continuing the endpoints after the previous leader's sync failed")


async def follow(state: GatewayState, ctl: PoolControl, cluster: Cluster) -> None:
    """A follower's loop: copy every generation of the leader's state, acking each."""
    connector = aiohttp.UnixConnector(path=cluster.socket("leader.sock"))
    timeout = aiohttp.ClientTimeout(total=_POLL_WAIT_S + 5.0)
    boot, gen = "", 0
    last_ok, lost = time.monotonic(), False
    trainer_held = False  # the last copy held the pool for the trainer (pause, release)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while True:
            try:
                params = {"index": str(cluster.index), "boot": boot, "generation": str(gen)}
                async with session.get("http://leader/state", params=params) as resp:
                    resp.raise_for_status()
                    data = orjson.loads(await resp.read())
                if (data["boot"], data["generation"]) != (boot, gen):
                    await mirror.apply(state, ctl, data["state"])
                    boot, gen = data["boot"], data["generation"]
                    trainer_held = bool(TRAINER_HOLDS & set(data["state"]["holds"]))
                last_ok = time.monotonic()
                if lost:
                    lost = False
                    LOG.info("control leader back")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the leader is gone or restarting: never stop copying
                if not lost and time.monotonic() - last_ok > _LOST_S:
                    lost = True
                    state.metrics.control_leader_lost.inc()
                    if trainer_held:  # the endpoints are paused or released: keep holding
                        LOG.warning(
                            "control leader unreachable (%s); keeping the trainer's hold "
                            "until it is back (at most control.hold_deadline_s)",
                            e,
                        )
                    else:
                        LOG.warning("control leader unreachable (%s); releasing its holds", e)
                        if mirror.MIRROR_HOLD in ctl.holds:
                            ctl.unhold(mirror.MIRROR_HOLD)
                await asyncio.sleep(_RETRY_S)


def install(
    app: web.Application, ctl: PoolControl, cluster: Cluster, paths: LeaderPaths
) -> Leader | None:
    """Wire this process into the cluster; the Leader on process 0, else None. `paths`: the
    route table's rows that the leader answers for every process."""
    state = app[STATE]
    if cluster.is_leader:
        lead = Leader(state, ctl, cluster)
        ctl.barrier = lead.barrier
        add_barrier(app, ctl, paths)

        async def restore(app: web.Application) -> AsyncIterator[None]:
            task = None
            if await _restore(state, ctl, cluster):
                task = asyncio.create_task(_continue_after_dead_sync(ctl))
            yield
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        app.cleanup_ctx.append(restore)
        return lead
    for pool in state.pools.values():
        pool.mirrored = True
    add_forwarding(app, cluster.socket("main.sock"), state.config.control.timeout_s, paths)

    async def copy(app: web.Application) -> AsyncIterator[None]:
        ctl.hold(mirror.MIRROR_HOLD)  # nothing routes on the trained pool before the first copy
        task = asyncio.create_task(follow(state, ctl, cluster), name="maskgate-follow")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(copy)
    return None


async def start_leader_sites(
    lead: Leader, runner: web.AppRunner, admin_runner: web.AppRunner | None
) -> web.AppRunner:
    """The leader's unix sockets: its traffic app, its admin app, and `leader.sock` (the
    state followers copy) on a runner of its own, returned for the caller to clean up."""
    cluster = lead.cluster
    await web.UnixSite(runner, cluster.socket("main.sock")).start()
    if admin_runner is not None:
        await web.UnixSite(admin_runner, cluster.socket("admin.sock")).start()
    app = web.Application()
    app.router.add_get("/state", lead.handle_state)
    leader_runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await leader_runner.setup()
    await web.UnixSite(leader_runner, cluster.socket("leader.sock")).start()
    return leader_runner
