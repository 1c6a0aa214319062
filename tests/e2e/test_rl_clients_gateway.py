"""The gateway as slime's, Miles' and verl's router, with real processes: a gateway with no
endpoints of its own and no keys, on loopback, and two tiny-random workers that the clients
register the way they register SGLang engines (slime: POST /workers; Miles: POST
/add_worker?url=), with no auth header, on the port they send traffic to. Then their generate
steps through it, slime's weight sync on the engines it lists and slime's abort of a
rollout, a broadcast sync sent to the gateway itself with no pause before it (SGLang's
default update: requests in flight keep running), Miles' weight-update session through it,
and slime's shutdown (DELETE
/workers/{id})."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import free_port
from rl_client_sync import RankZero, slime_sync_distributed
from rl_clients import (
    Sample,
    check_greedy,
    finished,
    http,
    long_request,
    miles_generate,
    miles_list_workers,
    miles_register,
    miles_unregister,
    ok,
    router_workers,
    slime_abort,
    slime_generate,
    slime_register,
    slime_sampling_params,
    slime_unregister,
    until,
    verl_generate,
    wait_server_healthy,
)
from rl_procs import Processes
from rl_trainer import (
    distributed_body,
    form_group,
    in_thread,
    offline_greedy,
    perturbed_weights,
    save_checkpoint,
)

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 33, 101, 7]
N = 12
LONG = 1500


@dataclass
class Router:
    url: str
    engines: list[str]
    tmp: Path
    version: str = "0"
    spec: str = "tiny-random"
    refs: dict[str, list[int]] = field(default_factory=dict)

    def expected(self) -> list[int]:
        if self.spec not in self.refs:
            self.refs[self.spec] = offline_greedy(self.spec, PROMPT, N)
        return self.refs[self.spec]

    def synced(self, seed: int, version: str) -> None:
        self.spec = str(save_checkpoint(self.tmp / f"seed{seed}", perturbed_weights(seed)))
        self.version = version


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    tmp = tmp_path_factory.mktemp("rl-clients-gateway")
    procs = Processes(tmp)
    port = free_port()
    config = {
        "host": "127.0.0.1",
        "port": port,
        "workers": 1,
        "log_level": "warning",
        "access_log": False,
        "timeouts": {"health_interval_s": 0.5},
        "control": {"flush_interval_s": 0.05, "timeout_s": 120},
    }
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(config))
    try:
        engines = [procs.worker(f"worker{i}") for i in range(2)]
        procs.start("gateway", ["gateway", "--config", str(tmp / "gateway.yaml")])
        url = f"http://127.0.0.1:{port}"
        for where in (*engines, url):
            procs.wait(where, "/health" if where != url else "/healthz")
        yield Router(url, engines, tmp)
    finally:
        procs.stop()


def check(router: Router, sample: Sample) -> None:
    check_greedy(sample, router.expected(), N, router.version)


def greedy(router: Router) -> Sample:
    return slime_generate(router.url, PROMPT, slime_sampling_params(0.0, max_new_tokens=N))


def in_flight(router: Router) -> tuple[Any, list[Any]]:
    """A slime request of LONG tokens through the gateway, running when this returns."""
    return long_request(router.url, PROMPT, LONG, router.engines)


def test_registration(router: Router) -> None:
    slime_engine, miles_engine = router.engines
    wait_server_healthy(slime_engine)  # each framework waits on its engine, then registers
    slime_register(router.url, slime_engine)
    wait_server_healthy(miles_engine, flush=True)
    miles_register(router.url, miles_engine)
    listed = router_workers(router.url)
    assert sorted(w["url"] for w in listed) == sorted(router.engines)
    assert len({w["id"] for w in listed}) == 2
    assert sorted(miles_list_workers(router.url)) == sorted(router.engines)
    until(lambda: all(w["is_healthy"] for w in router_workers(router.url)), "workers in rotation")


def test_generate_through_the_router(router: Router) -> None:
    """Their requests carry no mask: registered engines serve them too."""
    for _ in range(4):  # both engines
        check(router, greedy(router))
        miles = miles_generate(router.url, PROMPT, slime_sampling_params(0.0, max_new_tokens=N))
        check(router, miles)
        verl = verl_generate(router.url, PROMPT, N, True, temperature=0.0)
        assert verl.tokens == router.expected()[: len(verl.tokens)]
    top_p = slime_generate(router.url, PROMPT, slime_sampling_params(1.0, 0.9, max_new_tokens=N))
    assert top_p.top_p_offsets is not None and len(top_p.top_p_offsets) == len(top_p.tokens) + 1
    assert all(t in top_p.top_p_set(i) for i, t in enumerate(top_p.tokens))


def test_slime_sync_and_abort_on_listed_engines(router: Router) -> None:
    """slime updates the engines themselves; its rollout abort reaches them through the
    router's worker list."""
    engines = [w["url"] for w in router_workers(router.url)]
    rank0 = RankZero(engines, "slime-actor", free_port())
    try:
        assert [a["success"] for a in rank0.connect()] == [True, True]
        updates = slime_sync_distributed(rank0, perturbed_weights(11), 1, 200_000)
        assert all(u["success"] for u in updates)
    finally:
        rank0.disconnect()
    router.synced(11, "1")
    for _ in range(4):
        check(router, greedy(router))
    call = in_flight(router)
    assert sorted(slime_abort(router.url)) == sorted(router.engines)
    sample = finished(call)
    assert sample.status == "aborted" and sample.weight_versions == ["1"]


def test_sync_through_the_router_without_pause(router: Router) -> None:
    """A trainer that treats the gateway as its engine: init and update sent to it, no pause
    first. As with SGLang's default update, a request in flight is not aborted: it runs to
    its length across the update."""
    call = in_flight(router)
    ranks = ok("GET", router.url + "/get_world_size")["world_size"]
    assert ranks == 2

    def send(path: str, body: Any) -> tuple[int, Any]:
        return http("POST", router.url + path, body, timeout=180)

    group, (status, init) = form_group(send, free_port(), ranks, "router-sync", 120)
    assert status == 200, init
    try:
        weights = perturbed_weights(12)
        body = distributed_body(weights, "router-sync", weight_version="2")
        update = in_thread(lambda: send("/update_weights_from_distributed", body))
        group.broadcast(list(weights.values()))
        update[0].join()
        status, answer = update[1][0]
        assert status == 200, answer
        router.synced(12, "2")
    finally:
        send("/destroy_weights_update_group", {"group_name": "router-sync"})
        group.destroy()
    sample = finished(call)
    assert sample.status == "truncated" and len(sample.tokens) == LONG
    assert ok("GET", router.url + "/get_weight_version")["weight_version"] == "2"
    for _ in range(4):
        check(router, greedy(router))


def test_miles_weight_session_through_the_router(router: Router) -> None:
    """Miles' /begin_weight_update and /end_weight_update sent to the gateway: every engine
    opens (then closes) its own session, and a second begin is refused by each, so the
    gateway's answer names them all."""

    def post(path: str, body: Any) -> tuple[int, Any]:
        return http("POST", router.url + path, body)

    status, begun = post("/begin_weight_update", {"selector": "all"})
    assert status == 200 and begun["success"], begun
    assert sorted(e["url"] for e in begun["endpoints"]) == sorted(router.engines)
    status, again = post("/begin_weight_update", {"selector": "all"})
    assert status == 400 and again["error"]["code"] == "control_failed", again
    status, ended = post("/end_weight_update", {})
    assert status == 200 and ended["success"], ended
    status, again = post("/end_weight_update", {})
    assert status == 400 and again["error"]["code"] == "control_failed", again


def test_shutdown_unregisters(router: Router) -> None:
    """slime: DELETE /workers/{id} of its engine; Miles: POST /remove_worker?url=."""
    for gone, unregister, register in (
        (router.engines[0], slime_unregister, slime_register),
        (router.engines[1], miles_unregister, miles_register),
    ):
        unregister(router.url, gone)
        assert [w["url"] for w in router_workers(router.url)] == [
            e for e in router.engines if e != gone
        ]
        assert miles_list_workers(router.url) == [e for e in router.engines if e != gone]
        check(router, greedy(router))  # the other engine serves
        register(router.url, gone)
        listed = router_workers(router.url)
        assert sorted(w["url"] for w in listed) == sorted(router.engines)
