"""A named torch.distributed group between a trainer (rank 0) and workers, outside the global
process group: its own TCPStore, no `init_process_group`, so a worker (or a trainer that
already has a global group) can hold any number of them.

The store keys follow the layout of SGLang's `init_custom_process_group` (a rendezvous
store, prefixed by the group name, then by `<group_name>/` and `<device>/` as torch's group
helper does), so a trainer built on that helper and a worker built on this one meet. Rank 0
hosts the store. Every wait is bounded by `timeout_s`: a peer that never joins, or dies
mid-collective, fails the call instead of hanging it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, TCPStore

BACKENDS = ("gloo", "nccl")
POLL_S = 0.005  # how often a waiting broadcast checks for completion


class GroupError(RuntimeError):
    """Forming or using the group failed or timed out; the message says which."""


@dataclass
class WeightGroup:
    name: str
    backend: str  # "gloo" (CPU tensors) or "nccl" (CUDA tensors)
    rank: int
    world_size: int
    timeout_s: float
    pg: object  # a c10d ProcessGroupGloo / ProcessGroupNCCL backend
    store: TCPStore  # kept alive: rank 0 serves the other ranks from it

    def broadcast(self, tensors: list[torch.Tensor], src: int = 0) -> None:
        """Broadcast each tensor from `src`, in order, in place. Raises GroupError when the
        whole sequence does not complete within timeout_s (the group is unusable then)."""
        from torch.distributed import BroadcastOptions

        deadline = time.monotonic() + self.timeout_s
        works = []
        for t in tensors:
            opts = BroadcastOptions()
            opts.rootRank, opts.rootTensor = src, 0
            works.append(self.pg.broadcast([t], opts))  # type: ignore[attr-defined]
        for i, work in enumerate(works):
            while not work.is_completed():
                if time.monotonic() > deadline:
                    raise GroupError(
                        f"broadcast {i + 1} of {len(works)} in group {self.name!r} did not "
                        f"complete within {self.timeout_s:g} s (did rank {src} stop?)"
                    )
                time.sleep(POLL_S)
            try:
                work.wait()  # raises the backend's own error (a closed peer connection)
            except Exception as e:
                raise GroupError(f"broadcast {i + 1} of {len(works)} failed: {e}") from None
        if self.backend == "nccl":
            torch.cuda.current_stream().synchronize()

    def destroy(self) -> None:
        """Release the communicator; a stuck NCCL communicator is aborted, not waited for."""
        for method in ("abort", "shutdown"):
            fn = getattr(self.pg, method, None)
            if fn is not None:
                try:
                    fn()
                    break
                except Exception:  # already broken; nothing else to free
                    pass


def create_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
) -> WeightGroup:
    """Join (rank > 0) or host (rank 0) the group; returns once every rank has joined.
    Raises GroupError (with what went wrong) on a bad argument, a timeout or a refused
    connection."""
    if backend not in BACKENDS:
        raise GroupError(f"backend {backend!r} is not supported; supported: {list(BACKENDS)}")
    if not 0 <= rank < world_size:
        raise GroupError(f"rank {rank} is outside [0, world_size={world_size})")
    if backend == "nccl" and not torch.cuda.is_available():
        raise GroupError("backend 'nccl' needs CUDA; this process has no CUDA device")
    timeout = timedelta(seconds=timeout_s)
    try:
        store = TCPStore(
            master_address,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            multi_tenant=True,
        )
        device = "cuda" if backend == "nccl" else "cpu"
        prefixed = PrefixStore(
            f"{device}/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store))
        )
        if backend == "gloo":
            from torch.distributed import ProcessGroupGloo

            pg: object = ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            from torch.distributed import ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = timeout
            opts.is_high_priority_stream = False
            pg = ProcessGroupNCCL(prefixed, rank, world_size, opts)
        pg._set_sequence_number_for_group()  # type: ignore[attr-defined]
    except GroupError:
        raise
    except Exception as e:  # torch raises RuntimeError / DistStoreError / DistNetworkError
        raise GroupError(
            f"could not form group {group_name!r} at {master_address}:{master_port} as rank "
            f"{rank} of {world_size} within {timeout_s:g} s: {e}"
        ) from None
    return WeightGroup(group_name, backend, rank, world_size, timeout_s, pg, store)
