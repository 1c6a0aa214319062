"""slime's, Miles' and verl's request sequences (tests/e2e/rl_clients.py) against one real
tiny-random worker, as their engine: start-up, external-engine discovery, their generate
steps and what they parse, aborts, verl's sleep / wake-up, and each framework's weight sync.
After every sync the worker's greedy output must equal the worker's model run offline over
the weights the client sent, and the version must be the one it sent."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child_env import free_port
from rl_client_sync import (
    RankZero,
    miles_sync_distributed,
    miles_sync_fsdp,
    slime_sync_distributed,
    slime_sync_flattened,
    verl_sleep,
    verl_sync,
)
from rl_clients import (
    Sample,
    abort_until_idle,
    check_greedy,
    finished,
    http,
    long_request,
    miles_generate,
    ok,
    running,
    slime_discover,
    slime_generate,
    slime_sampling_params,
    verl_generate,
    wait_server_healthy,
)
from rl_payloads import safetensors_entry
from rl_procs import Processes
from rl_trainer import offline_greedy, perturbed_weights, save_checkpoint

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 33, 101, 7]
N = 12
BUCKET = 200_000  # bytes: tiny-random's 558 KB of weights in 3-4 buckets
LONG = 1500  # tokens of a request that is still running when the test acts on it


@dataclass
class Engine:
    url: str
    tmp: Path
    version: str = "0"
    spec: str = "tiny-random"  # the weights it serves now
    refs: dict[str, list[int]] = field(default_factory=dict)

    def expected(self) -> list[int]:
        if self.spec not in self.refs:
            self.refs[self.spec] = offline_greedy(self.spec, PROMPT, N)
        return self.refs[self.spec]

    def synced(self, seed: int, version: str) -> None:
        """The client's sync answered: the weights of `seed` at `version` from now on."""
        path = self.tmp / f"seed{seed}"
        if not path.exists():
            save_checkpoint(path, perturbed_weights(seed))
        self.spec, self.version = str(path), version


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp("rl-clients-worker")
    procs = Processes(tmp)
    try:
        url = procs.worker("worker")
        procs.wait(url, "/health")
        yield Engine(url, tmp)
    finally:
        procs.stop()


@pytest.fixture(autouse=True)
def serving(engine: Engine) -> Iterator[None]:
    """A sequence that failed half-way must not leave the next test a paused worker."""
    yield
    http("POST", engine.url + "/continue_generation", {})
    http("POST", engine.url + "/resume_memory_occupation", {})


def check_serving(engine: Engine, sample: Sample) -> None:
    check_greedy(sample, engine.expected(), N, engine.version)


def greedy(engine: Engine) -> Sample:
    return slime_generate(engine.url, PROMPT, slime_sampling_params(0.0, max_new_tokens=N))


def in_flight(engine: Engine) -> tuple[Any, list[Any]]:
    """A slime request of LONG tokens, running on the engine when this returns."""
    return long_request(engine.url, PROMPT, LONG, [engine.url])


def test_startup_and_discovery(engine: Engine) -> None:
    wait_server_healthy(engine.url)  # slime: health_generate, with "Bearer None"
    wait_server_healthy(engine.url, flush=True)  # Miles and verl: then flush_cache
    found = slime_discover(engine.url, {"enable_memory_saver": False})
    assert (found.worker_type, found.num_gpus, found.bootstrap_port) == ("regular", 1, None)
    miles = ok("GET", engine.url + "/get_server_info")  # Miles' external-engine check
    assert miles["enable_memory_saver"] is False and miles["tp_size"] == 1
    assert ok("GET", engine.url + "/get_weight_version")["weight_version"] == "0"  # slime
    assert ok("GET", engine.url + "/model_info")["weight_version"] == "0"  # Miles


def test_generate_steps(engine: Engine) -> None:
    check_serving(engine, greedy(engine))
    miles = miles_generate(engine.url, PROMPT, slime_sampling_params(0.0, max_new_tokens=N))
    check_serving(engine, miles)
    assert miles.log_probs is not None and all(lp <= 0 for lp in miles.log_probs)
    for logprobs in (True, False):
        verl = verl_generate(engine.url, PROMPT, N, logprobs, temperature=0.0)
        assert verl.tokens == engine.expected()[: len(verl.tokens)]
        assert (verl.log_probs is not None) == logprobs


def test_slime_top_p_ids(engine: Engine) -> None:
    """slime below top-p 1 asks for each token's top-p set and replays it in its loss."""
    sampled = slime_generate(engine.url, PROMPT, slime_sampling_params(1.0, 0.9, max_new_tokens=N))
    assert (
        sampled.top_p_offsets is not None and len(sampled.top_p_offsets) == len(sampled.tokens) + 1
    )
    for i, token in enumerate(sampled.tokens):
        kept = sampled.top_p_set(i)
        assert token in kept and len(set(kept)) == len(kept) >= 1
    assert sampled.log_probs is not None and all(lp <= 0 for lp in sampled.log_probs)
    # Greedy: each set is the token alone, its log-prob over the set 0.
    argmax = slime_generate(engine.url, PROMPT, slime_sampling_params(0.0, 0.9, max_new_tokens=N))
    check_serving(engine, argmax)
    assert [argmax.top_p_set(i) for i in range(len(argmax.tokens))] == [[t] for t in argmax.tokens]
    assert argmax.log_probs == [0.0] * len(argmax.tokens)


def test_slime_and_verl_aborts(engine: Engine) -> None:
    call = in_flight(engine)
    abort_until_idle([engine.url])  # slime: abort_all, then /v1/loads until 0
    sample = finished(call)
    assert sample.status == "aborted" and 0 < len(sample.tokens) < LONG
    assert sample.weight_versions == [engine.version]
    call = in_flight(engine)
    ok("POST", engine.url + "/abort_request", {"rid": "", "abort_all": True})  # verl
    assert finished(call).status == "aborted"
    assert running(engine.url) == 0


def test_verl_sleep_and_wake_up(engine: Engine) -> None:
    check_serving(engine, greedy(engine))
    verl_sleep(engine.url)
    assert http("GET", engine.url + "/health_generate")[0] == 503  # nothing can run
    ok("POST", engine.url + "/resume_memory_occupation", {"tags": ["weights"]})
    ok("POST", engine.url + "/resume_memory_occupation", {"tags": ["kv_cache"]})
    wait_server_healthy(engine.url)
    check_serving(engine, greedy(engine))


def test_slime_distributed_sync(engine: Engine) -> None:
    """slime's broadcast sync in buckets; its pause ({} = abort) ends the running request."""
    rank0 = RankZero([engine.url], "slime-actor", free_port())
    try:
        answers = rank0.connect()
        assert [a["success"] for a in answers] == [True]
        call = in_flight(engine)
        updates = slime_sync_distributed(rank0, perturbed_weights(1), 1, BUCKET)
        assert len(updates) >= 3 and all(u["success"] for u in updates), updates
        aborted = finished(call)
        assert aborted.status == "aborted" and aborted.weight_versions == [engine.version]
        engine.synced(1, "1")
        check_serving(engine, greedy(engine))
        assert ok("GET", engine.url + "/get_weight_version")["weight_version"] == "1"
    finally:
        rank0.disconnect()


def test_miles_distributed_sync(engine: Engine) -> None:
    """Miles: pause (retract), flush, begin, one bucket per tensor, the version, end,
    continue."""
    rank0 = RankZero([engine.url], "miles-actor", free_port())
    try:
        rank0.connect()
        weights = perturbed_weights(2)
        answers = miles_sync_distributed(rank0, weights, 2, bucket_bytes=1)
        assert len(answers) == len(weights) + 3  # begin, one per tensor, version, end
        engine.synced(2, "2")
        check_serving(engine, greedy(engine))
        assert ok("GET", engine.url + "/model_info")["weight_version"] == "2"
    finally:
        rank0.disconnect()


def test_miles_in_place_sync_keeps_running_requests(engine: Engine) -> None:
    """Miles with pause_generation_mode in_place (no flush): the request in flight holds
    through the update and runs to its length, its version the new one at the end."""
    rank0 = RankZero([engine.url], "miles-in-place", free_port())
    try:
        rank0.connect()
        call = in_flight(engine)
        miles_sync_distributed(rank0, perturbed_weights(8), 8, BUCKET, mode="in_place")
        engine.synced(8, "8")
        kept = finished(call)
        assert kept.status == "truncated" and len(kept.tokens) == LONG
        assert kept.weight_versions == ["8"]
        check_serving(engine, greedy(engine))
    finally:
        rank0.disconnect()


def test_slime_flattened_bucket_sync(engine: Engine) -> None:
    answers = slime_sync_flattened(engine.url, perturbed_weights(3), 3, BUCKET)
    assert len(answers) >= 3 and all(a["success"] for a in answers), answers
    engine.synced(3, "3")
    check_serving(engine, greedy(engine))


def test_miles_fsdp_flattened_bucket_sync(engine: Engine) -> None:
    answers = miles_sync_fsdp(engine.url, perturbed_weights(4), 4, BUCKET)
    assert all(a["success"] for a in answers), answers
    engine.synced(4, "4")
    check_serving(engine, greedy(engine))


def test_verl_sync(engine: Engine) -> None:
    """verl sends no version: the weights change, the version stays."""
    check_serving(engine, greedy(engine))
    verl_sleep(engine.url)
    answers = verl_sync(engine.url, perturbed_weights(5), BUCKET)
    assert len(answers) >= 3 and all(a["success"] for a in answers), answers
    engine.synced(5, engine.version)
    verl = verl_generate(engine.url, PROMPT, N, True, temperature=0.0)
    assert verl.tokens == engine.expected()[: len(verl.tokens)]


def test_safetensors_payload(engine: Engine) -> None:
    """The pickle-free encoding of the same update: a safetensors file per entry."""
    weights = perturbed_weights(6)
    body = {"serialized_named_tensors": [safetensors_entry(list(weights.items()))],
            "load_format": "safetensors", "flush_cache": False, "weight_version": "6"}  # fmt: skip
    answer = ok("POST", engine.url + "/update_weights_from_tensor", body)
    assert answer["success"], answer
    engine.synced(6, "6")
    check_serving(engine, greedy(engine))


def test_get_weights_by_name(engine: Engine) -> None:
    """SGLang's update tests read weights back: the first `truncate_size` rows."""
    weights = perturbed_weights(7)
    rank0 = RankZero([engine.url], "slime-check", free_port())
    try:
        rank0.connect()
        slime_sync_distributed(rank0, weights, 7, BUCKET)
    finally:
        rank0.disconnect()
    engine.synced(7, "7")
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.norm.weight"):
        body = {"name": name, "truncate_size": 10}
        got = torch.tensor(ok("POST", engine.url + "/get_weights_by_name", body))
        assert torch.allclose(got, weights[name][:10], atol=1e-6), name
    check_serving(engine, greedy(engine))
