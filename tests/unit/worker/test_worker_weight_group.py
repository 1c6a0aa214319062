"""The weight-update group (maskgate/worker/rl/weight_group.py) against a trainer that forms its
side the way SGLang's `init_custom_process_group` and slime's `init_process_group` do
(rendezvous, a group-name prefix, torch's own group helper), so the store keys must agree;
and the bounds on joining."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

from maskgate.worker.rl.weight_group import GroupError, create_group


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sglang_style_trainer(port: int, done: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = timedelta(seconds=30)
    url = f"tcp://127.0.0.1:{port}"
    store, _, _ = next(rendezvous(url, rank=0, world_size=2, timeout=timeout))
    store = PrefixStore("policy", store)
    pg, _ = _new_process_group_helper(
        2, 0, [], Backend("gloo"), store, group_name="policy", timeout=timeout
    )
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    for t in (torch.arange(6.0).reshape(2, 3), torch.full((4,), 7, dtype=torch.bfloat16)):
        dist.broadcast(t, 0, group=pg)
    done.put("sent")


def test_joins_a_group_formed_by_torchs_own_helper() -> None:
    ctx = mp.get_context("spawn")
    port, done = _port(), ctx.Queue()
    trainer = ctx.Process(target=sglang_style_trainer, args=(port, done))
    trainer.start()
    try:
        group = create_group(master_address="127.0.0.1", master_port=port, rank=1,
                             world_size=2, group_name="policy", backend="gloo", timeout_s=30)  # fmt: skip
        a, b = torch.empty(2, 3), torch.empty(4, dtype=torch.bfloat16)
        group.broadcast([a, b])
        assert torch.equal(a, torch.arange(6.0).reshape(2, 3))
        assert torch.equal(b, torch.full((4,), 7, dtype=torch.bfloat16))
        assert done.get(timeout=30) == "sent"
        group.destroy()
    finally:
        trainer.join(30)
        if trainer.is_alive():
            trainer.kill()


def test_a_trainer_that_never_comes_fails_the_join_in_time() -> None:
    t0 = time.monotonic()
    with pytest.raises(GroupError, match="within 1 s"):
        create_group(master_address="127.0.0.1", master_port=_port(), rank=1, world_size=2,
                     group_name="g", backend="gloo", timeout_s=1)  # fmt: skip
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"backend": "mpi"}, "not supported"), ({"rank": 2}, "outside"), ({"rank": -1}, "outside")],
)
def test_bad_arguments(kw: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"master_address": "127.0.0.1", "master_port": 1, "rank": 1,
                            "world_size": 2, "group_name": "g", "backend": "gloo", "timeout_s": 1}  # fmt: skip
    with pytest.raises(GroupError, match=needle):
        create_group(**{**args, **kw})
