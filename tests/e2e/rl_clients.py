"""The HTTP sequences that slime, Miles and verl send to SGLang engines and to their router,
as plain functions: same paths, methods, bodies, headers and order, and the same checks on
the answers those clients parse. Written from reading the three clients' SGLang code; none
of it is imported. Weight payloads are built by tests/e2e/rl_payloads.py.

slime (its SGLang engine actor, megatron weight updaters and rollout):
- Start-up: GET /health_generate every 2 s until 200, sending `Content-Type: application/json;
  charset=utf-8` and `Authorization: Bearer <api_key>` (the literal `Bearer None` without a
  key). External engines: GET /server_info, else /get_server_info; reads `tp_size`,
  `pp_size`, `num_gpus`, `encoder_only`, `disaggregation_mode` (`prefill`/`decode` or a
  regular worker), `disaggregation_bootstrap_port`, and asserts that each launch argument it
  would have set and does not skip (`enable_memory_saver` without rollout offload, `dtype`
  with fp16) equals the engine's.
- Registration: POST {router}/workers `{"url": "http://host:port", "worker_type": "regular"}`,
  no auth header, raise_for_status. Shutdown: GET {router}/workers, find the entry whose
  `url` matches, DELETE {router}/workers/{id}.
- Weight sync, distributed (gloo here; NCCL on GPUs): once, POST /init_weights_update_group
  `{master_address, master_port, rank_offset, world_size, group_name, backend}` to every
  engine (engine i at rank_offset 1 + its GPUs before it) while rank 0 joins. Each sync:
  version += 1; POST /pause_generation `{}` (SGLang's default mode, abort) to every engine;
  GET /flush_cache until 200 (60 tries, 1 s apart); per bucket of at most
  `update_weight_buffer_size` bytes, POST /update_weights_from_distributed `{names, dtypes
  ("bfloat16", no "torch."), shapes, group_name, flush_cache: false, weight_version: str}`
  to every engine while rank 0 broadcasts the bucket's tensors in order; then POST
  /continue_generation `{}`. At the end, POST /destroy_weights_update_group `{group_name}`.
- Weight sync, co-located: same pause / flush / continue; per bucket and dtype, one
  FlattenedTensorBucket `{"flattened_tensor", "metadata"}` through SGLang's
  MultiprocessingSerializer (ForkingPickler, base64 string), POST /update_weights_from_tensor
  `{serialized_named_tensors: [one per engine rank], load_format: "flattened_bucket",
  weight_version: str}`.
- Generate: POST {router}/generate `{"sampling_params": {temperature, top_p, top_k,
  max_new_tokens, stop, stop_token_ids, skip_special_tokens, no_stop_trim: true,
  spaces_between_special_tokens: false} (+ "custom_params": {"return_top_p_token_ids":
  true} when top_p != 1), "return_logprob": true, "input_ids": [...]}`. Parses
  `meta_info.output_token_logprobs` (item[1] the token, item[0] its log-prob), `text`,
  `meta_info.finish_reason.type` (length -> truncated, abort -> aborted, stop -> completed),
  `meta_info.weight_version` (appended to the sample's versions), and base64 int32
  `top_p_token_ids` / `top_p_token_offsets` (offsets start at 0, end at the id count, one
  more than the new tokens).
- Abort of a rollout: GET {router}/workers, then for each worker URL POST /abort_request
  `{"abort_all": true}` and GET /v1/loads?include=core until its request count is 0.

Miles (a slime fork; its own SGLang engine actor, FSDP and megatron updaters):
- Start-up: /health_generate as slime, then GET /flush_cache until 200. External engines:
  GET /get_server_info, fields compared as slime does.
- Registration: POST {router}/add_worker?url=http://host:port (no body) with its own router
  or an older sgl-router, else POST /workers as slime. Shutdown: /remove_worker?url= or
  DELETE /workers/{id}. Its multi-LoRA path lists workers with GET /list_workers (`urls`)
  or GET /workers.
- Weight sync: POST /pause_generation `{"mode": pause_generation_mode}` (default
  "retract"); GET /flush_cache until 200 (skipped for "in_place"); POST
  /begin_weight_update `{"selector": "all"}`; buckets as slime with `"selector": "all"`
  added to every update body (distributed, or FSDP's flattened buckets with
  `flush_cache: false`, each followed by GET /flush_cache); megatron's distributed path then
  POSTs /update_weight_version `{"new_version": str, "abort_all_requests": false}`; POST
  /end_weight_update `{}`; POST /continue_generation `{}`. Each answer whose `success` is
  false raises.
- Generate: POST {router}/generate `{"input_ids", "sampling_params" (slime's keys),
  "return_logprob": true, "return_routed_experts": false, "return_indexer_topk": false}`;
  parses as slime (output_token_logprobs only when present, `text`, finish_reason,
  weight_version).

verl (its HTTP server adapter and SGLang rollout, hybrid mode):
- Start-up: GET /health_generate every 2 s until 200 (slime's headers), then GET
  /flush_cache until 200.
- Weight sync: after a rollout POST /release_memory_occupation `{"tags": ["kv_cache",
  "weights"]}`; before the next, POST /resume_memory_occupation `{"tags": ["weights"]}`;
  per bucket of `update_weights_bucket_megabytes`, SGLang's `update_weights` helper builds
  `[(name, LocalSerializedTensor(values=[one ForkingPickler dump per TP rank]))]`, dumps that
  once more, and the adapter POSTs /update_weights_from_tensor `{serialized_named_tensors:
  [base64], load_format: null, flush_cache: true}` (no weight_version); GET /flush_cache
  until 200; POST /resume_memory_occupation `{"tags": ["kv_cache"]}`.
- Abort: POST /abort_request `{"rid": "", "abort_all": true}`.
- Generate: `{"rid", "input_ids", "sampling_params": {temperature, top_p, top_k,
  repetition_penalty: 1.0, max_new_tokens}, "return_logprob"}`; with log-probs it unzips
  `output_token_logprobs` as (log_prob, token_id, _) triples (strictly), else reads
  `output_ids`.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

HEALTH_HEADERS = {"Content-Type": "application/json; charset=utf-8"}
POLL_S = 0.2  # the clients poll every 1-2 s; shorter here, same loop


class ClientError(AssertionError):
    """What the client's own check raises (requests' raise_for_status, its asserts)."""


def http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, Any]:
    """(status, JSON answer, or its text when not JSON); error statuses are answers too."""
    data = None if body is None else json.dumps(body).encode()
    hdrs = dict(headers or {})
    if body is not None:
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data, hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def ok(method: str, url: str, body: Any = None, **kw: Any) -> Any:
    """requests' call + raise_for_status: the answer of a 2xx, else ClientError."""
    status, answer = http(method, url, body, **kw)
    if not 200 <= status < 300:
        raise ClientError(f"{method} {url}: HTTP {status}: {answer}")
    return answer


def until(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise ClientError(f"{what}: not done within {timeout_s} s")
        time.sleep(POLL_S)


def started(call: tuple[Any, list[Any]], running: Callable[[], bool]) -> None:
    """Until `running()`, while the call's thread is alive (one that ended or raised fails
    at once, not after the timeout)."""
    thread, box = call

    def check() -> bool:
        if not thread.is_alive():
            raise ClientError(f"the request ended before it was seen running: {box}")
        return running()

    until(check, "the request running")


def finished(call: tuple[Any, list[Any]], timeout_s: float = 180) -> Any:
    """What a call started with `in_thread` returned, once its thread ended."""
    thread, box = call
    thread.join(timeout_s)
    assert box, "the in-flight request raised"
    return box[0]


def running(url: str) -> int:
    """The requests an engine holds now, as slime reads them from /v1/loads."""
    return requests_in_load(ok("GET", url + "/v1/loads?include=core"))


def check_greedy(sample: Sample, ref: list[int], n: int, version: str) -> None:
    """A greedy answer of n tokens: the reference's tokens (to a stop token, which slime
    keeps with no_stop_trim) at the given weight version."""
    assert sample.tokens == ref[: len(sample.tokens)], (sample.tokens, ref)
    assert len(sample.tokens) == n or sample.status == "completed"
    assert sample.weight_versions == [version]


def long_request(url: str, prompt: list[int], tokens: int, engines: list[str]) -> Any:
    """A slime request of `tokens` tokens (eos ignored) to `url`, running on one of `engines`
    when this returns: the (thread, box) of `in_thread`, for `finished`."""
    from rl_trainer import in_thread

    params = {**slime_sampling_params(0.0, max_new_tokens=tokens), "ignore_eos": True}
    call = in_thread(lambda: slime_generate(url, prompt, params))
    started(call, lambda: sum(running(e) for e in engines) > 0)
    return call


def status_is_200(method: str, url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return http(method, url, headers=headers, timeout=10)[0] == 200
    except (urllib.error.URLError, OSError):
        return False


# ---- start-up -------------------------------------------------------------------------


def wait_server_healthy(url: str, api_key: str | None = None, flush: bool = False) -> None:
    """slime / Miles / verl launch wait: /health_generate until 200 (with `Bearer None` when
    there is no key); Miles and verl then poll GET /flush_cache until 200."""
    headers = {**HEALTH_HEADERS, "Authorization": f"Bearer {api_key}"}
    until(lambda: status_is_200("GET", url + "/health_generate", headers), "health_generate")
    if flush:
        until(lambda: status_is_200("GET", url + "/flush_cache", headers), "flush_cache")


def slime_server_info(url: str) -> dict[str, Any]:
    """slime's get_server_info: /server_info, falling back to /get_server_info."""
    errors = []
    for path in ("/server_info", "/get_server_info"):
        status, body = http("GET", url + path, timeout=30)
        if status == 200 and isinstance(body, dict):
            return body
        errors.append(f"{path}: {status}")
    raise ClientError(f"no server info from {url}: {errors}")


@dataclass(frozen=True)
class ExternalEngine:
    url: str
    worker_type: str
    num_gpus: int
    bootstrap_port: int | None


def slime_discover(url: str, expected: dict[str, Any]) -> ExternalEngine:
    """slime's external-engine discovery and its sanity check of the launch arguments."""
    info = slime_server_info(url)
    pp = int(info.get("pp_size") or info.get("pipeline_parallel_size") or 1)
    tp = int(info.get("tp_size") or info.get("tensor_parallel_size") or 1)
    gpus = int(info.get("num_gpus") or info.get("num_gpus_per_engine") or tp * pp)
    mode = info.get("disaggregation_mode")
    kind = (
        "encoder"
        if info.get("encoder_only")
        else mode
        if mode in ("prefill", "decode")
        else "regular"
    )
    port = info.get("disaggregation_bootstrap_port")
    for name, value in expected.items():
        if info.get(name) != value:
            raise ClientError(f"{name=} expect {value!r} actual {info.get(name)!r}")
    return ExternalEngine(url, kind, gpus, int(port) if port is not None else None)


# ---- registration on the router -------------------------------------------------------


def slime_register(router: str, engine: str) -> Any:
    return ok("POST", router + "/workers", {"url": engine, "worker_type": "regular"})


def miles_register(router: str, engine: str) -> Any:
    return ok("POST", f"{router}/add_worker?url={engine}")


def miles_unregister(router: str, engine: str) -> Any:
    return ok("POST", f"{router}/remove_worker?url={engine}")


def router_workers(router: str) -> list[dict[str, Any]]:
    workers = ok("GET", router + "/workers")["workers"]
    if not all(isinstance(w.get("url"), str) and "id" in w for w in workers):
        raise ClientError(f"/workers entries without url / id: {workers}")
    return list(workers)


def miles_list_workers(router: str) -> list[str]:
    return list(ok("GET", router + "/list_workers")["urls"])


def slime_unregister(router: str, engine: str) -> Any:
    """slime's shutdown: the worker's id from GET /workers, then DELETE /workers/{id}."""
    for worker in router_workers(router):
        if worker["url"] == engine:
            return ok("DELETE", f"{router}/workers/{worker['id']}")
    raise ClientError(f"{engine} is not registered on {router}")


def requests_in_load(load: Any) -> int:
    """slime's count of an engine's requests from /v1/loads (or older load shapes)."""
    if isinstance(load, list):
        return sum(requests_in_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return requests_in_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return int(load[key])
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return (running if isinstance(running, int) else 0) + (
        waiting if isinstance(waiting, int) else 0
    )


def slime_abort(router: str) -> list[str]:
    """slime's rollout abort: every worker the router lists, aborted until idle."""
    urls = [w["url"] for w in router_workers(router)]
    abort_until_idle(urls)
    return urls


def abort_until_idle(urls: list[str]) -> None:
    for url in urls:
        ok("POST", url + "/abort_request", {"abort_all": True})
        until(partial(_idle, url), f"{url} idle after abort")


def _idle(url: str) -> bool:
    return requests_in_load(ok("GET", url + "/v1/loads?include=core")) <= 0


# ---- generation -----------------------------------------------------------------------


@dataclass
class Sample:
    """What a client keeps of one answer."""

    tokens: list[int]
    log_probs: list[float] | None
    text: str | None = None
    status: str | None = None
    weight_versions: list[str] = field(default_factory=list)
    top_p_ids: torch.Tensor | None = None
    top_p_offsets: torch.Tensor | None = None

    def top_p_set(self, i: int) -> list[int]:
        assert self.top_p_ids is not None and self.top_p_offsets is not None
        lo, hi = int(self.top_p_offsets[i]), int(self.top_p_offsets[i + 1])
        return self.top_p_ids[lo:hi].tolist()


STATUS = {"length": "truncated", "abort": "aborted", "stop": "completed"}


def slime_sampling_params(
    temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, max_new_tokens: int = 16
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": temperature, "top_p": top_p, "top_k": top_k,
        "max_new_tokens": max_new_tokens, "stop": None, "stop_token_ids": None,
        "skip_special_tokens": True, "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }  # fmt: skip
    if top_p != 1.0:
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


def _int32s(meta: dict[str, Any], keys: Sequence[str]) -> torch.Tensor | None:
    for key in keys:
        if key in meta and meta[key] is not None:
            raw = base64.b64decode(meta[key].encode("ascii"))
            return torch.frombuffer(bytearray(raw), dtype=torch.int32)
    return None


def _apply_meta(sample: Sample, meta: dict[str, Any], new_tokens: int) -> None:
    """slime's Sample._apply_meta_info (Miles': update_from_meta_info)."""
    ids = _int32s(meta, ("top_p_token_ids", "top_p_kept_token_ids"))
    offsets = _int32s(meta, ("top_p_token_offsets", "top_p_kept_token_offsets"))
    if (ids is None) != (offsets is None):
        raise ClientError("top-p replay must include both token ids and offsets")
    if ids is not None and offsets is not None and new_tokens:
        if offsets.numel() == 0 or int(offsets[0]) != 0 or int(offsets[-1]) != ids.numel():
            raise ClientError(f"top-p offsets {offsets.tolist()} do not frame {ids.numel()} ids")
        if offsets.numel() != new_tokens + 1:
            raise ClientError(f"{offsets.numel()} top-p offsets for {new_tokens} tokens")
        sample.top_p_ids, sample.top_p_offsets = ids, offsets
    if "finish_reason" not in meta:
        return
    if "weight_version" in meta:
        sample.weight_versions.append(meta["weight_version"])
    sample.status = STATUS.get(meta["finish_reason"]["type"])


def slime_generate(router: str, prompt: list[int], params: dict[str, Any]) -> Sample:
    payload = {"sampling_params": params, "return_logprob": True, "input_ids": prompt}
    out = ok("POST", router + "/generate", payload)
    items = out["meta_info"].get("output_token_logprobs") or []
    sample = Sample([it[1] for it in items], [it[0] for it in items], text=out["text"])
    _apply_meta(sample, out["meta_info"], len(items))
    return sample


def miles_generate(router: str, prompt: list[int], params: dict[str, Any]) -> Sample:
    body = {k: v for k, v in params.items() if k != "max_new_tokens"}
    payload = {
        "input_ids": prompt,
        "sampling_params": {**body, "max_new_tokens": params["max_new_tokens"]},
        "return_logprob": True,
        "return_routed_experts": False,
        "return_indexer_topk": False,
    }
    out = ok("POST", router + "/generate", payload)
    items = out["meta_info"].get("output_token_logprobs") or []
    sample = Sample([it[1] for it in items], [it[0] for it in items], text=out["text"])
    if out["meta_info"].get("routed_experts") is not None:
        raise ClientError("routed_experts returned though not asked for")
    _apply_meta(sample, out["meta_info"], len(items))
    return sample


def verl_generate(
    url: str, prompt: list[int], max_new_tokens: int, logprobs: bool, **sampling: Any
) -> Sample:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    params.update(sampling, max_new_tokens=max_new_tokens)
    request = {"rid": uuid.uuid4().hex, "input_ids": prompt, "sampling_params": params,
               "return_logprob": logprobs}  # fmt: skip
    out = ok("POST", url + "/generate", request)
    if not logprobs:
        return Sample(list(out["output_ids"]), None, status=_finish(out))
    triples = out["meta_info"]["output_token_logprobs"]
    log_probs, tokens = zip(*[(lp, tok) for lp, tok, _ in triples], strict=True)
    return Sample(list(tokens), list(log_probs), status=_finish(out))


def _finish(out: dict[str, Any]) -> str | None:
    return STATUS.get(out["meta_info"]["finish_reason"]["type"])


# ---- weight sync ----------------------------------------------------------------------


def buckets(
    tensors: dict[str, torch.Tensor], limit: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The trainers' bucketing: tensors in order, a new bucket once `limit` bytes would be
    passed (a tensor larger than `limit` alone in its bucket)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def distributed_body(bucket: list[tuple[str, torch.Tensor]], group: str, version: int) -> dict:
    return {
        "names": [n for n, _ in bucket],
        "dtypes": [str(t.dtype).replace("torch.", "") for _, t in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
        "group_name": group,
        "flush_cache": False,
        "weight_version": str(version),
    }


def flush_until_done(url: str, tries: int = 60) -> None:
    """slime's / Miles' flush_cache: GET until 200, `tries` times."""
    for _ in range(tries):
        if http("GET", url + "/flush_cache")[0] == 200:
            return
        time.sleep(POLL_S)
    raise ClientError(f"Timeout while flushing cache on {url}")


def check_success(answers: Sequence[Any]) -> None:
    """Miles' _check_weight_sync_results: an answer with `success` false raises."""
    for answer in answers:
        if isinstance(answer, dict) and answer.get("success") is False:
            raise ClientError(f"weight sync failed on rollout engine: {answer}")
