"""SGLang's weight routes around the updates themselves: the update session Miles opens and
closes around every sync (/begin_weight_update, /end_weight_update), the read-out its and
SGLang's tests check weights with (/get_weights_by_name), and checkpoint-engine's
/update_weights_from_ipc, which this worker answers as SGLang does when such an update fails.
"""

from __future__ import annotations

from aiohttp import web

from maskgate.protocol.errors import ApiError
from maskgate.protocol.responses import json_response
from maskgate.worker.server.control_body import Body
from maskgate.worker.server.params import invalid
from maskgate.worker.server.state import STATE
from maskgate.worker.server.weight_routes import SELECTORS, on_engine

DEFAULT_TRUNCATE = 100  # GetWeightsByNameReqInput.truncate_size
MAX_READ_VALUES = 1 << 22  # floats one /get_weights_by_name answer may carry


async def handle_begin(request: web.Request) -> web.Response:
    """Opens the session; the updates inside it are the ordinary ones (this worker copies in
    place, so there is nothing to unpack first). A second begin fails, as in SGLang."""
    state, body = request.app[STATE].get(), await Body.read(request)
    selector = body.string("selector", "all")
    body.refuse("selector", SELECTORS, "draft-model weights")
    sync = state.sync
    if sync.session is not None:
        msg = "A weight update session is already open; call /end_weight_update first."
        return json_response({"success": False, "message": msg}, status=400)
    sync.session = selector
    return json_response({"success": True, "message": "Weight update session opened."})


async def handle_end(request: web.Request) -> web.Response:
    state = request.app[STATE].get()
    await Body.read(request)  # run_post_load and the like: nothing to post-process here
    sync = state.sync
    if sync.session is None:
        msg = "No weight update session is open; call /begin_weight_update first."
        return json_response({"success": False, "message": msg}, status=400)
    sync.session = None
    return json_response({"success": True, "message": "Weight update session closed."})


async def handle_get_weights_by_name(request: web.Request) -> web.Response:
    """The parameter's first `truncate_size` rows as nested float lists; a Hugging Face part
    of a fused parameter (q_proj, up_proj, ...) gives its own rows."""
    from maskgate.worker.rl.weights import WeightUpdateError

    state, body = request.app[STATE].get(), await Body.read(request)
    name = body.string("name", required=True)
    rows = body.integer("truncate_size", minimum=0, maximum=1 << 20, default=DEFAULT_TRUNCATE)
    wmap = state.sync.wmap

    def read() -> object:
        return wmap.read(name, rows, MAX_READ_VALUES)

    try:
        async with state.update_lock:  # never half-way through an update's copy
            values = await on_engine(state, read)
    except WeightUpdateError as e:
        raise ApiError("weights_not_found", f"Get parameter by name failed: {e}") from None
    return json_response(values)


async def handle_update_from_ipc(request: web.Request) -> web.Response:
    """checkpoint-engine's path: the engine connects to a ZMQ socket per GPU UUID that the
    request names, and receives weights over it. This worker does not connect to sockets a
    request names; it answers SGLang's failed-update shape, and nothing changes."""
    body = await Body.read(request)
    handles = body.data.get("zmq_handles")
    if not isinstance(handles, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in handles.items()
    ):
        raise invalid("zmq_handles", "must be an object of device UUID -> ZMQ socket path")
    body.boolean("flush_cache", True)
    body.string("weight_version")
    msg = (
        "Failed to update weights from IPC: checkpoint-engine's ZMQ transfer is not supported by "
        "this worker; send the tensors to /update_weights_from_tensor instead."
    )
    return json_response({"success": False, "message": msg}, status=400)
