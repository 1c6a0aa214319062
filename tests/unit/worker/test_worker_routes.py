"""The worker's route table and keys: the table is exactly what the app serves, and every
access level answers as SGLang's `decide_request_auth` does under every key configuration
(no key, api key only, admin key only, both), by Bearer and by `x-api-key`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from maskgate.cli import main
from maskgate.protocol.errors import ApiError
from maskgate.worker.config import WorkerConfig, load_config
from maskgate.worker.server import create_app
from maskgate.worker.server.auth import Access, Keys, check_access
from maskgate.worker.server.backend import Backend
from maskgate.worker.server.routes import ROUTES

CONFIG = WorkerConfig(model="tiny-random", device="cpu", max_model_len=64, max_num_seqs=4)
API, ADMIN = "client-key", "admin-key"


@pytest.fixture(scope="module")
def worker_config() -> WorkerConfig:
    return CONFIG


def test_every_route_is_declared_once_in_the_table() -> None:
    pairs = [(m, row.path) for row in ROUTES for m in row.methods]
    assert len(pairs) == len(set(pairs))
    # Control routes are never plain `normal`, health and metrics never need a key.
    for row in ROUTES:
        if row.path.startswith(("/health", "/metrics")):
            assert row.access is Access.PUBLIC, row.path
        if row.path.startswith(("/update_weight", "/pause", "/continue", "/abort", "/flush")):
            assert row.access is Access.ADMIN_OPTIONAL, row.path


async def test_the_app_serves_exactly_the_table(client: TestClient) -> None:
    served = {
        (route.method, route.resource.canonical)
        for route in client.app.router.routes()
        if route.resource is not None
    }
    declared = {(m, row.path) for row in ROUTES for m in row.methods}
    assert served == declared  # no implicit HEAD, nothing registered outside the table
    r = await client.get("/start_profile")  # an SGLang route this worker does not serve
    assert (r.status, (await r.json())["error"]["code"]) == (404, "not_found")
    r = await client.delete("/generate")
    assert (r.status, (await r.json())["error"]["code"]) == (405, "method_not_allowed")


async def test_put_generate_is_post_generate(client: TestClient) -> None:
    body = {"input_ids": [3, 4, 5], "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    posted = await (await client.post("/generate", json=body)).json()
    r = await client.put("/generate", json=body)
    assert r.status == 200
    assert (await r.json())["output_ids"] == posted["output_ids"]


KEYS = {
    "none": Keys(),
    "api": Keys(api_key=API.encode()),
    "admin": Keys(admin_api_key=ADMIN.encode()),
    "both": Keys(api_key=API.encode(), admin_api_key=ADMIN.encode()),
}
# (access, key configuration) -> the keys that pass; SGLang's decide_request_auth table.
PASSES = {
    (Access.PUBLIC, "none"): {None, API, ADMIN, "wrong"},
    (Access.PUBLIC, "api"): {None, API, ADMIN, "wrong"},
    (Access.PUBLIC, "admin"): {None, API, ADMIN, "wrong"},
    (Access.PUBLIC, "both"): {None, API, ADMIN, "wrong"},
    (Access.NORMAL, "none"): {None, API, ADMIN, "wrong"},
    (Access.NORMAL, "api"): {API},
    (Access.NORMAL, "admin"): {None, API, ADMIN, "wrong"},  # the admin key guards control only
    (Access.NORMAL, "both"): {API},  # the admin key is not an api key
    (Access.ADMIN_OPTIONAL, "none"): {None, API, ADMIN, "wrong"},
    (Access.ADMIN_OPTIONAL, "api"): {API},
    (Access.ADMIN_OPTIONAL, "admin"): {ADMIN},
    (Access.ADMIN_OPTIONAL, "both"): {ADMIN},  # a client key never reaches control
}


@pytest.mark.parametrize(("access", "config"), sorted(PASSES, key=str))
@pytest.mark.parametrize("header", ["Authorization", "x-api-key"])
def test_access_levels_under_every_key_configuration(
    access: Access, config: str, header: str
) -> None:
    for sent in (None, API, ADMIN, "wrong"):
        headers = {} if sent is None else {header: f"Bearer {sent}" if header[0] == "A" else sent}
        try:
            check_access(access, headers, KEYS[config])
            passed = True
        except ApiError as e:
            assert e.status == 401 and e.code in ("invalid_api_key", "invalid_admin_key")
            assert sent is None or sent not in e.message  # never echoed
            passed = False
        assert passed == (sent in PASSES[access, config]), (access, config, header, sent)


def test_bearer_parsing() -> None:
    keys = KEYS["api"]
    check_access(Access.NORMAL, {"Authorization": f"bearer {API}"}, keys)  # scheme any case
    for value in (API, f"Basic {API}", f"Bearer {API} ", f"Bearer  {API}", "Bearer", "Bearer "):
        with pytest.raises(ApiError):
            check_access(Access.NORMAL, {"Authorization": value}, keys)
    with pytest.raises(ApiError):  # a header string that is no valid UTF-8: refused, no 500
        check_access(Access.NORMAL, {"Authorization": "Bearer \udcff"}, keys)


@pytest.fixture
async def keyed(backend: Backend) -> AsyncIterator[TestClient]:
    config = CONFIG.model_copy(
        update={"api_key": SecretStr(API), "admin_api_key": SecretStr(ADMIN)}
    )
    async with TestClient(TestServer(create_app(config, backend=backend))) as c:
        yield c


async def test_keys_over_http(keyed: TestClient) -> None:
    bearer = {"Authorization": f"Bearer {API}"}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for path in ("/health", "/metrics"):
        assert (await keyed.get(path)).status == 200  # probes and scrapers hold no key
    r = await keyed.get("/v1/models")
    assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert (await r.json())["error"]["code"] == "invalid_api_key"
    assert (await keyed.get("/v1/models", headers=bearer)).status == 200
    assert (await keyed.get("/v1/models", headers={"x-api-key": API})).status == 200
    assert (await keyed.get("/v1/models", headers=admin)).status == 401
    # A refused inference call is refused before its body is read or anything runs.
    r = await keyed.post("/generate", data=b"{not json")
    assert r.status == 401
    body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}}
    assert (await keyed.post("/generate", json=body, headers=bearer)).status == 200
    # Control takes the admin key, never the client key.
    r = await keyed.post("/pause_generation", json={}, headers=bearer)
    assert (r.status, (await r.json())["error"]["code"]) == (401, "invalid_admin_key")
    assert (await keyed.get("/model_info")).status == 401
    info = await (await keyed.get("/model_info", headers=bearer)).json()
    assert info["paused"] is None  # the refused pause changed nothing
    assert (await keyed.post("/continue_generation", json={}, headers=admin)).status == 200


def test_keys_from_flags_and_env_stay_verbatim_and_are_never_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"MASKGATE_WORKER_API_KEY": "12345", "MASKGATE_WORKER_ADMIN_API_KEY": "yes"}
    config = load_config(env=env)
    assert config.api_key is not None and config.api_key.get_secret_value() == "12345"
    assert config.admin_api_key is not None and config.admin_api_key.get_secret_value() == "yes"
    flagged = load_config(env=env, overrides={"api_key": "from-flag"})
    assert flagged.api_key is not None and flagged.api_key.get_secret_value() == "from-flag"
    assert load_config(env={}).api_key is None
    with pytest.raises(Exception, match="api_key"):
        load_config(env={"MASKGATE_WORKER_API_KEY": ""})
    monkeypatch.setenv("MASKGATE_WORKER_ADMIN_API_KEY", "s3cret-admin")
    assert main(["worker", "--api-key", "s3cret-client", "--check-config"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    printed = json.loads(out)
    assert printed["api_key"] == printed["admin_api_key"] == "**********"
