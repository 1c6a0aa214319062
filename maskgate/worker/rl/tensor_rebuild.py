"""The only things a tensor payload may name, each our own object: checked stand-ins for
torch's tensor rebuilders, inert markers for the classes a payload mentions, the floating
dtypes, and records for the trainers' two dataclasses (SGLang's `FlattenedTensorMetadata`
and `LocalSerializedTensor`).

Every callable checks the type and range of every argument before anything else runs, and
builds its result itself; a payload never gets hold of a real torch class or function, so it
cannot set attributes on them (the unpickler refuses BUILD on anything but a fresh record).
See `maskgate/worker/rl/tensor_decode.py` for the unpickler and docs/worker.md for the formats.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing.reductions as _reductions

from maskgate.worker.rl.weights import WeightUpdateError

MAX_NDIM = 8
MAX_HANDLE_BYTES = 4096  # CUDA IPC (expandable segments: longer), ref-counter, event handles
MAX_NAME_CHARS = 512
SHM_DIR = "/dev/shm"
_SHM_NAME = re.compile(rb"/torch_[0-9]+_[0-9]+_[0-9]+")
# torch's own CUDA rebuilder, captured before anything could replace it.
_TORCH_REBUILD_CUDA = _reductions.rebuild_cuda_tensor
_TORCH_REBUILD_FILENAME = _reductions.rebuild_storage_filename

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "uint8": torch.uint8,  # the byte buffer of a multi-dtype flattened bucket
}


class PayloadError(WeightUpdateError):
    """A tensor payload that is refused; nothing it names has run."""


class Marker:
    """An inert stand-in for a class a payload names (torch.Tensor, UntypedStorage, ...)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


TENSOR = Marker("torch.Tensor")
PARAMETER = Marker("torch.nn.Parameter")
UNTYPED_STORAGE = Marker("torch.UntypedStorage")
TYPED_STORAGE_CLS = Marker("torch.TypedStorage")  # what torch's CUDA reducer names


class Budget:
    """Bytes of tensor data one payload may reference (shared storages and CUDA buffers)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def take(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.max_bytes:
            raise PayloadError(
                f"{what} takes the payload past {self.max_bytes} bytes of tensor data, more "
                "than this model's weights need"
            )


@dataclass
class SharedStorage:
    """A CPU storage mapped from a trainer's shared memory."""

    storage: torch.UntypedStorage


@dataclass
class TypedStorage:
    shared: SharedStorage
    dtype: torch.dtype


class Checked:
    """A callable a payload may REDUCE: `check` validates the arguments and builds the
    result; it receives the decoder's budget."""

    def __init__(self, name: str, check: Callable[..., Any], arities: tuple[int, ...]) -> None:
        self.name = name
        self.check = check
        self.arities = arities

    def __call__(self, budget: Budget, args: tuple[Any, ...]) -> Any:
        if len(args) not in self.arities:
            raise PayloadError(f"{self.name} takes {self.arities} arguments, got {len(args)}")
        return self.check(budget, *args)


# --- argument checks -------------------------------------------------------------------------


def _int(value: Any, what: str, lo: int = 0, hi: int = 2**48) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise PayloadError(f"{what} must be an integer in [{lo}, {hi}], got {kind_of(value)}")
    return value


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if type(value) not in (tuple, list) or len(value) > MAX_NDIM:
        raise PayloadError(f"{what} must be a tuple of at most {MAX_NDIM} integers")
    return tuple(_int(d, f"{what} entries") for d in value)


def _dtype(value: Any) -> torch.dtype:
    if not isinstance(value, torch.dtype) or value not in DTYPES.values():
        raise PayloadError(f"dtype must be one of {sorted(DTYPES)}, got {kind_of(value)}")
    return value


def _bytes(value: Any, what: str, limit: int, *, text: bool = True) -> bytes:
    """Bytes of bounded length; `text` ones (paths, names, handles handed to C) hold no NUL."""
    if type(value) is not bytes or not 0 < len(value) <= limit or (text and b"\0" in value):
        raise PayloadError(f"{what} must be 1 to {limit} bytes" + (" without NUL" if text else ""))
    return value


def kind_of(value: Any) -> str:
    """A refused value, named without calling anything of it."""
    if type(value) in (int, float, bool, type(None)):
        return repr(value)
    return f"a {type(value).__name__}"


def _need_bytes(size: tuple[int, ...], stride: tuple[int, ...], offset: int, item: int) -> int:
    """Bytes of storage the view (size, stride, offset) reaches."""
    if len(size) != len(stride):
        raise PayloadError(f"size has {len(size)} dims but stride has {len(stride)}")
    if any(d == 0 for d in size):
        return 0
    extent = 1 + sum((d - 1) * s for d, s in zip(size, stride, strict=True))
    return (offset + extent) * item


def _numel(size: tuple[int, ...]) -> int:
    n = 1
    for d in size:
        n *= d
    return n


# --- the rebuilders --------------------------------------------------------------------------


def _size(budget: Budget, dims: Any) -> tuple[int, ...]:
    return _dims(dims, "torch.Size")


def _storage_filename(
    budget: Budget, cls: Any, manager: Any, handle: Any, size: Any, dtype: Any = None
) -> SharedStorage:
    """torch's `rebuild_storage_filename`: a shared-memory file of the trainer's, by name."""
    if cls is not UNTYPED_STORAGE or dtype is not None:
        raise PayloadError("a shared CPU storage must be an UntypedStorage (torch >= 2)")
    manager = _bytes(manager, "the shared-memory manager path", 4096)
    handle = _bytes(handle, "the shared-memory name", 128)
    nbytes = _int(size, "the storage size")
    if not _SHM_NAME.fullmatch(handle):
        raise PayloadError("the shared-memory name is not one torch's file_system sharing makes")
    try:
        sock = os.stat(manager)
        shm = os.stat(os.path.join(SHM_DIR, handle.decode()[1:]))
    except OSError:
        raise PayloadError(
            "the shared memory or its manager is gone (the trainer must keep the tensors alive "
            "until the call answers, on this machine)"
        ) from None
    if not stat.S_ISSOCK(sock.st_mode) or not stat.S_ISREG(shm.st_mode) or shm.st_size < nbytes:
        raise PayloadError("the shared memory does not hold the storage it announces")
    budget.take(nbytes, "a shared storage")
    storage = _TORCH_REBUILD_FILENAME(torch.UntypedStorage, manager, handle, nbytes)
    return SharedStorage(storage)


def _typed_storage(budget: Budget, shared: Any, dtype: Any) -> TypedStorage:
    if not isinstance(shared, SharedStorage):
        raise PayloadError(f"rebuild_typed_storage needs a shared storage, got {kind_of(shared)}")
    return TypedStorage(shared, _dtype(dtype))


def _cpu_tensor(budget: Budget, cls: Any, typed: Any, metadata: Any) -> torch.Tensor:
    """torch's `rebuild_tensor`: a view of a shared storage, checked to lie inside it."""
    if cls is not TENSOR and cls is not PARAMETER:
        raise PayloadError(
            f"a tensor's class must be torch.Tensor or Parameter, got {kind_of(cls)}"
        )
    if not isinstance(typed, TypedStorage):
        raise PayloadError(f"rebuild_tensor needs a typed shared storage, got {kind_of(typed)}")
    if type(metadata) is not tuple or len(metadata) != 4:
        raise PayloadError("rebuild_tensor's metadata must be (offset, size, stride, grad)")
    offset, size, stride, grad = metadata
    offset = _int(offset, "the storage offset")
    size, stride = _dims(size, "the tensor size"), _dims(stride, "the tensor stride")
    if type(grad) is not bool:
        raise PayloadError("requires_grad must be a bool")
    item = typed.dtype.itemsize
    storage = typed.shared.storage
    if _need_bytes(size, stride, offset, item) > storage.nbytes():
        raise PayloadError("the tensor reaches past the end of its shared storage")
    return torch.tensor([], dtype=typed.dtype).set_(storage, offset, size, stride)


def _cuda_tensor(budget: Budget, *args: Any) -> torch.Tensor:
    """torch's `rebuild_cuda_tensor` (15 arguments), also as SGLang's patched one whose
    device is a GPU's UUID string; torch's own rebuilder runs once all are checked."""
    (cls, size, stride, offset, storage_cls, dtype, device, handle, storage_bytes,
     storage_offset, grad, ref_handle, ref_offset, event, sync) = args  # fmt: skip
    if cls is not TENSOR and cls is not PARAMETER:
        raise PayloadError(
            f"a tensor's class must be torch.Tensor or Parameter, got {kind_of(cls)}"
        )
    if storage_cls is not UNTYPED_STORAGE and storage_cls is not TYPED_STORAGE_CLS:
        raise PayloadError("a CUDA tensor's storage class must be UntypedStorage or TypedStorage")
    size, stride = _dims(size, "the tensor size"), _dims(stride, "the tensor stride")
    offset, dtype = _int(offset, "the storage offset"), _dtype(dtype)
    storage_bytes = _int(storage_bytes, "the storage size")
    storage_offset = _int(storage_offset, "the storage's offset in its allocation")
    if _need_bytes(size, stride, offset, dtype.itemsize) > storage_bytes:
        raise PayloadError("the tensor reaches past the end of its CUDA storage")
    if type(grad) is not bool or type(sync) is not bool:
        raise PayloadError("requires_grad and event_sync_required must be bools")
    ref_offset = _int(ref_offset, "the ref-counter offset")
    index = _cuda_device(device)
    budget.take(storage_bytes, "a CUDA storage")
    if handle is None and storage_bytes == 0 and _numel(size) == 0:
        return torch.zeros(size, dtype=dtype, device=f"cuda:{index}")
    handle = _bytes(handle, "the CUDA IPC handle", MAX_HANDLE_BYTES, text=False)
    ref_handle = _bytes(ref_handle, "the ref-counter handle", MAX_HANDLE_BYTES)
    if event is not None:
        event = _bytes(event, "the CUDA event handle", MAX_HANDLE_BYTES, text=False)
    return _TORCH_REBUILD_CUDA(torch.Tensor, size, stride, offset, torch.UntypedStorage, dtype,
                               index, handle, storage_bytes, storage_offset, False, ref_handle,
                               ref_offset, event, sync)  # fmt: skip


def _cuda_device(device: Any) -> int:
    """A device index, or the UUID SGLang's patched reducer writes instead."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if type(device) is int:
        if not 0 <= device < count:
            raise PayloadError(f"CUDA device {device} does not exist here ({count} devices)")
        return device
    if type(device) is str and len(device) <= 128:
        for i in range(count):
            if str(torch.cuda.get_device_properties(i).uuid) == device:
                return i
        raise PayloadError("no CUDA device of this worker has the payload's device UUID")
    raise PayloadError(f"a CUDA device must be an index or a UUID, got {kind_of(device)}")


REBUILD_TENSOR = Checked("rebuild_tensor", _cpu_tensor, (3,))
REBUILD_CUDA = Checked("rebuild_cuda_tensor", _cuda_tensor, (15,))
SIZE = Checked("torch.Size", _size, (1,))
STORAGE_FILENAME = Checked("rebuild_storage_filename", _storage_filename, (4, 5))
TYPED_STORAGE = Checked("rebuild_typed_storage", _typed_storage, (2,))


# --- records: the trainers' dataclasses, by field ----------------------------------------------


def _name(value: Any) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_NAME_CHARS:
        raise PayloadError(f"a tensor name must be a string of 1 to {MAX_NAME_CHARS} characters")
    return value


def _values(value: Any) -> list[bytes]:
    if type(value) is not list or not 0 < len(value) <= 1024:
        raise PayloadError("LocalSerializedTensor.values must be a list of 1 to 1024 entries")
    return [_bytes(v, "LocalSerializedTensor.values entries", 2**20, text=False) for v in value]


class RecordType:
    """A dataclass a payload may build (NEWOBJ, then BUILD with a dict of exactly its fields,
    each checked)."""

    def __init__(self, name: str, fields: dict[str, Callable[[Any], Any]]) -> None:
        self.name = name
        self.fields = fields


class Record:
    def __init__(self, kind: RecordType) -> None:
        self.kind = kind
        self.values: dict[str, Any] | None = None

    def build(self, state: Any) -> None:
        if self.values is not None:
            raise PayloadError(f"{self.kind.name} is built twice")
        if type(state) is not dict or set(state) != set(self.kind.fields):
            raise PayloadError(
                f"{self.kind.name} must be built from exactly {sorted(self.kind.fields)}"
            )
        self.values = {k: check(state[k]) for k, check in self.kind.fields.items()}


FLAT_META = RecordType(
    "FlattenedTensorMetadata",
    {
        "name": _name,
        "shape": lambda v: _dims(v, "FlattenedTensorMetadata.shape"),
        "dtype": _dtype,
        "start_idx": lambda v: _int(v, "FlattenedTensorMetadata.start_idx"),
        "end_idx": lambda v: _int(v, "FlattenedTensorMetadata.end_idx"),
        "numel": lambda v: _int(v, "FlattenedTensorMetadata.numel"),
    },
)
LOCAL_TENSOR = RecordType("LocalSerializedTensor", {"values": _values})

_REDUCTIONS = "torch.multiprocessing.reductions"
_BUCKET_MODULES = ("sglang.srt.weight_sync.tensor_bucket", "sglang.srt.model_executor.model_runner")
_PATCH_MODULES = ("sglang.srt.utils.patch_torch", "sglang.srt.patch_torch")

# Exact (module, qualified name) -> what the payload gets instead. Nothing else resolves.
GLOBALS: dict[tuple[str, str], Any] = {
    (_REDUCTIONS, "rebuild_tensor"): REBUILD_TENSOR,
    (_REDUCTIONS, "rebuild_typed_storage"): TYPED_STORAGE,
    (_REDUCTIONS, "rebuild_storage_filename"): STORAGE_FILENAME,
    (_REDUCTIONS, "rebuild_cuda_tensor"): REBUILD_CUDA,
    **{(m, "_rebuild_cuda_tensor_modified"): REBUILD_CUDA for m in _PATCH_MODULES},
    ("torch", "Tensor"): TENSOR,
    ("torch.nn.parameter", "Parameter"): PARAMETER,
    ("torch", "Size"): SIZE,
    ("torch.storage", "UntypedStorage"): UNTYPED_STORAGE,
    ("torch", "UntypedStorage"): UNTYPED_STORAGE,
    ("torch.storage", "TypedStorage"): TYPED_STORAGE_CLS,
    **{("torch", name): dtype for name, dtype in DTYPES.items()},
    **{(m, "FlattenedTensorMetadata"): FLAT_META for m in _BUCKET_MODULES},
    ("sglang.srt.model_executor.model_runner", "LocalSerializedTensor"): LOCAL_TENSOR,
}

# Names refused with a message saying how to send the payload instead.
EXPLAINED = {
    ("multiprocessing.resource_sharer", "DupFd"): "file_descriptor",
    (_REDUCTIONS, "rebuild_storage_fd"): "file_descriptor",
}
