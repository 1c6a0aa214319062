"""The weight-sync sequences of slime, Miles and verl (their order and bodies are listed in
rl_clients.py's docstring), with this process as the trainer's rank 0 of a gloo group."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_clients import buckets, check_success, distributed_body, flush_until_done, http, ok
from rl_payloads import by_dtype, flattened_bucket, local_serialized
from rl_trainer import in_thread

Named = list[tuple[str, torch.Tensor]]


class RankZero:
    """The trainer's rank 0 and the engines it updates (engine i is rank i + 1)."""

    def __init__(self, engines: list[str], group_name: str, port: int) -> None:
        self.engines = engines
        self.group_name = group_name
        self.port = port
        self.group: Any = None

    def connect(self, timeout_s: float = 60) -> list[Any]:
        """slime's connect_rollout_engines_from_distributed: every engine's init call runs
        while this process joins; returns their answers."""
        from maskgate.worker.rl.weight_group import create_group

        world = 1 + len(self.engines)
        calls = [
            in_thread(lambda url=url, rank=i + 1: ok("POST", url + "/init_weights_update_group", {
                "master_address": "127.0.0.1", "master_port": self.port, "rank_offset": rank,
                "world_size": world, "group_name": self.group_name, "backend": "gloo"}))
            for i, url in enumerate(self.engines)
        ]  # fmt: skip
        self.group = create_group(
            master_address="127.0.0.1", master_port=self.port, rank=0, world_size=world,
            group_name=self.group_name, backend="gloo", timeout_s=timeout_s,
        )  # fmt: skip
        return _joined(calls)

    def push(self, path: str, body: dict[str, Any], tensors: list[torch.Tensor]) -> list[Any]:
        """One bucket: `body` to every engine while rank 0 broadcasts `tensors` in order."""
        calls = [in_thread(lambda url=url: ok("POST", url + path, body)) for url in self.engines]
        self.group.broadcast(tensors)
        return _joined(calls)

    def disconnect(self) -> None:
        """slime's disconnect: destroy on every engine (errors ignored), then here."""
        for url in self.engines:  # an engine without the group answers an error: ignored
            http("POST", url + "/destroy_weights_update_group", {"group_name": self.group_name})
        if self.group is not None:
            self.group.destroy()


def _joined(calls: list[Any]) -> list[Any]:
    for thread, _ in calls:
        thread.join()
    out = []
    for _, box in calls:
        if not box:
            raise AssertionError("a call raised; see the thread's traceback above")
        out.append(box[0])
    return out


def _each(engines: list[str], path: str, body: dict[str, Any]) -> list[Any]:
    return [ok("POST", url + path, body) for url in engines]


def slime_sync_distributed(
    rank0: RankZero, tensors: dict[str, torch.Tensor], version: int, bucket_bytes: int
) -> list[Any]:
    """slime's UpdateWeightFromDistributed.update_weights; the update answers."""
    _each(rank0.engines, "/pause_generation", {})
    for url in rank0.engines:
        flush_until_done(url)
    answers: list[Any] = []
    for bucket in buckets(tensors, bucket_bytes):
        body = distributed_body(bucket, rank0.group_name, version)
        answers += rank0.push("/update_weights_from_distributed", body, [t for _, t in bucket])
    _each(rank0.engines, "/continue_generation", {})
    return answers


def miles_sync_distributed(
    rank0: RankZero,
    tensors: dict[str, torch.Tensor],
    version: int,
    bucket_bytes: int,
    mode: str = "retract",
) -> list[Any]:
    """Miles' megatron distributed update, every answer checked for `success`."""
    engines = rank0.engines
    _each(engines, "/pause_generation", {"mode": mode})
    if mode != "in_place":
        for url in engines:
            flush_until_done(url)
    answers = _each(engines, "/begin_weight_update", {"selector": "all"})
    for bucket in buckets(tensors, bucket_bytes):
        body = {**distributed_body(bucket, rank0.group_name, version), "selector": "all"}
        answers += rank0.push("/update_weights_from_distributed", body, [t for _, t in bucket])
        check_success(answers)
    new = {"new_version": str(version), "abort_all_requests": False}
    answers += _each(engines, "/update_weight_version", new)
    answers += _each(engines, "/end_weight_update", {})
    _each(engines, "/continue_generation", {})
    check_success(answers)
    return answers


def _flattened_updates(url: str, bucket: Named, extra: dict[str, Any]) -> list[Any]:
    answers = []
    for named in by_dtype(bucket):
        entry, held = flattened_bucket(named)
        body = {"serialized_named_tensors": [entry], "load_format": "flattened_bucket", **extra}
        answers.append(ok("POST", url + "/update_weights_from_tensor", body))
        del held  # alive until the engine answered
    return answers


def slime_sync_flattened(
    url: str, tensors: dict[str, torch.Tensor], version: int, bucket_bytes: int
) -> list[Any]:
    """slime's UpdateWeightFromTensor.update_weights for a co-located engine of one rank."""
    ok("POST", url + "/pause_generation", {})
    flush_until_done(url)
    answers = []
    extra = {"flush_cache": False, "weight_version": str(version)}
    for bucket in buckets(tensors, bucket_bytes):
        answers += _flattened_updates(url, bucket, extra)
    ok("POST", url + "/continue_generation", {})
    return answers


def miles_sync_fsdp(
    url: str, tensors: dict[str, torch.Tensor], version: int, bucket_bytes: int
) -> list[Any]:
    """Miles' FSDP UpdateWeightFromTensor: pause (retract), flush, begin, flattened buckets
    each followed by a flush, end, continue."""
    ok("POST", url + "/pause_generation", {"mode": "retract"})
    flush_until_done(url)
    answers = [ok("POST", url + "/begin_weight_update", {"selector": "all"})]
    extra = {"flush_cache": False, "selector": "all", "weight_version": str(version)}
    for bucket in buckets(tensors, bucket_bytes):
        answers += _flattened_updates(url, bucket, extra)
        check_success(answers)
        flush_until_done(url)
    answers.append(ok("POST", url + "/end_weight_update", {}))
    ok("POST", url + "/continue_generation", {})
    check_success(answers)
    return answers


def verl_sleep(url: str) -> Any:
    return ok("POST", url + "/release_memory_occupation", {"tags": ["kv_cache", "weights"]})


def verl_sync(url: str, tensors: dict[str, torch.Tensor], bucket_bytes: int) -> list[Any]:
    """verl's hybrid-engine wake-up with new weights: weights back, the buckets through
    SGLang's update_weights helper, a flush, then the KV cache back."""
    ok("POST", url + "/resume_memory_occupation", {"tags": ["weights"]})
    answers = []
    for bucket in buckets(tensors, bucket_bytes):
        entry, held = local_serialized(bucket)
        body = {"serialized_named_tensors": [entry], "load_format": None, "flush_cache": True}
        answers.append(ok("POST", url + "/update_weights_from_tensor", body))
        del held
    flush_until_done(url)
    ok("POST", url + "/resume_memory_occupation", {"tags": ["kv_cache"]})
    return answers
