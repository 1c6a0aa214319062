"""Decoding one entry of `/update_weights_from_tensor`'s `serialized_named_tensors` into
(name, tensor) pairs, for each `load_format` a trainer sends (docs/worker.md, "Tensor
payloads"):

- `null` / `"direct"`: SGLang's `MultiprocessingSerializer` (a ForkingPickler dump, base64) of
  `[(name, tensor)]`, the tensors shared-memory CPU tensors or CUDA IPC handles, or verl's
  `LocalSerializedTensor` wrappers holding one such dump per rank;
- `"flattened_bucket"`: the same serializer over `{"flattened_tensor", "metadata"}`, the form
  slime's and Miles' co-located path sends (SGLang's `FlattenedTensorBucket`);
- `"safetensors"`: base64 of a safetensors file: no pickle at all.

A pickle is first scanned without running anything: every opcode must be one of a short list,
and every global it names must be an exact (module, name) pair of `tensor_rebuild.GLOBALS`
(no prefixes, no dotted names). Only then does it load, through a pure-Python unpickler whose
REDUCE calls only our checked rebuilders, whose NEWOBJ builds only our records, and whose
BUILD fills only a fresh record. Anything else is a `PayloadError` (400) before it runs.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import pickletools
from typing import Any, ClassVar, cast

import torch

from maskgate.worker.rl import tensor_rebuild as rb
from maskgate.worker.rl.tensor_rebuild import Budget, PayloadError, Record

MAX_ENTRIES = 100_000
WHERE = "serialized_named_tensors[0]"

_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG1",
        "BINFLOAT",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "SHORT_BINBYTES",
        "BINBYTES",
        "BINBYTES8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_DICT",
        "DICT",
        "SETITEM",
        "SETITEMS",
        "MEMOIZE",
        "BINPUT",
        "LONG_BINPUT",
        "BINGET",
        "LONG_BINGET",
        "GLOBAL",
        "STACK_GLOBAL",
        "REDUCE",
        "NEWOBJ",
        "BUILD",
    }
)
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"})
_NEUTRAL = frozenset({"PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT"})


def decode(entry: str, load_format: str | None, max_bytes: int) -> list[tuple[str, Any]]:
    """(name, tensor) pairs of one entry; PayloadError (nothing ran) when refused."""
    try:
        raw = base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError):
        raise PayloadError(f"{WHERE} is not valid base64") from None
    budget = Budget(max_bytes)
    if load_format == "safetensors":
        return _safetensors(raw)
    obj = _unpickle(raw, budget)
    if load_format == "flattened_bucket":
        return _bucket(obj)
    return _named(obj, budget)


def scan(raw: bytes) -> list[tuple[str, str]]:
    """The globals a pickle names, found without running it; PayloadError on any opcode or
    global outside the allow-lists."""
    names: list[tuple[str, str]] = []
    memo: dict[int, Any] = {}
    known: list[Any] = []  # the stack's top items while they are known strings
    try:
        for op, arg, _pos in pickletools.genops(raw):
            name = op.name
            if name not in _OPCODES:
                raise PayloadError(f"{WHERE} uses the pickle opcode {name}, which is refused")
            if name in _STRINGS:
                known.append(arg)
            elif name in ("BINGET", "LONG_BINGET"):
                known.append(memo.get(cast(int, arg)))
            elif name == "MEMOIZE":
                memo[len(memo)] = known[-1] if known else None
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[cast(int, arg)] = known[-1] if known else None
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                pair = _global_pair(name, arg, known)
                _check_global(*pair)
                names.append(pair)
                known = [None]
            elif name not in _NEUTRAL:
                known = [None]
    except PayloadError:
        raise
    except ValueError as e:  # genops: truncated or malformed bytes
        raise PayloadError(f"{WHERE} is not a valid pickle: {e}") from None
    return names


def _global_pair(op: str, arg: Any, known: list[Any]) -> tuple[str, str]:
    if op == "GLOBAL":
        module, _, name = str(arg).partition(" ")
        return module, name
    if len(known) < 2 or not isinstance(known[-2], str) or not isinstance(known[-1], str):
        raise PayloadError(f"{WHERE} names a global that is not two plain strings")
    return known[-2], known[-1]


def _check_global(module: str, name: str) -> None:
    if (module, name) in rb.GLOBALS:
        return
    if (module, name) in rb.EXPLAINED:
        raise PayloadError(
            f"{WHERE} shares CPU tensors by file descriptor, which only works between a parent "
            "process and its children; call torch.multiprocessing.set_sharing_strategy("
            "'file_system') before pickling"
        )
    why = " (dotted names are never resolved)" if "." in name else ""
    raise PayloadError(
        f"{WHERE} names {module}.{name}, which is not a tensor part this worker accepts{why}"
    )


class _Unpickler(pickle._Unpickler):
    """pickle's pure-Python unpickler with our globals and our REDUCE / NEWOBJ / BUILD; every
    other opcode outside `_OPCODES` is missing from its dispatch table."""

    dispatch: ClassVar[dict[int, Any]] = {}
    stack: list[Any]  # pickle._Unpickler's, set by load()
    append: Any

    def __init__(self, raw: bytes, budget: Budget) -> None:
        super().__init__(io.BytesIO(raw))
        self.budget = budget

    def find_class(self, module: str, name: str) -> Any:
        _check_global(module, name)
        return rb.GLOBALS[(module, name)]

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if not isinstance(func, rb.Checked) or type(args) is not tuple:
            raise PayloadError(f"{WHERE} calls {rb.kind_of(func)}, which is not a rebuilder")
        self.stack[-1] = func(self.budget, args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(cls, rb.RecordType) or type(args) is not tuple or args:
            raise PayloadError(f"{WHERE} instantiates {rb.kind_of(cls)}, which is not a record")
        self.append(Record(cls))

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if not isinstance(inst, Record):
            raise PayloadError(f"{WHERE} sets the state of {rb.kind_of(inst)}, which is refused")
        inst.build(state)


_Unpickler.dispatch = {
    op.code.encode("latin-1")[0]: pickle._Unpickler.dispatch[op.code.encode("latin-1")[0]]
    for op in pickletools.opcodes
    if op.name in _OPCODES
}
_Unpickler.dispatch[pickle.REDUCE[0]] = _Unpickler.load_reduce
_Unpickler.dispatch[pickle.NEWOBJ[0]] = _Unpickler.load_newobj
_Unpickler.dispatch[pickle.BUILD[0]] = _Unpickler.load_build


def _unpickle(raw: bytes, budget: Budget) -> Any:
    scan(raw)
    try:
        return _Unpickler(raw, budget).load()
    except PayloadError:
        raise
    except Exception as e:  # a truncated pickle, a vanished shared-memory file, ...
        raise PayloadError(f"cannot decode {WHERE}: {type(e).__name__}: {e}") from None


def _named(obj: Any, budget: Budget) -> list[tuple[str, Any]]:
    """`[(name, tensor | LocalSerializedTensor)]` -> (name, tensor) pairs."""
    if type(obj) not in (list, tuple) or len(obj) > MAX_ENTRIES:
        raise PayloadError(f"{WHERE} must decode to a list of (name, tensor) pairs")
    out = []
    for item in obj:
        if type(item) not in (list, tuple) or len(item) != 2 or type(item[0]) is not str:
            raise PayloadError(f"{WHERE} must decode to a list of (name, tensor) pairs")
        name, value = item
        if isinstance(value, Record) and value.kind is rb.LOCAL_TENSOR and value.values:
            value = _unpickle(value.values["values"][0], budget)
        if not isinstance(value, torch.Tensor):
            raise PayloadError(f"{WHERE}: {name[:100]!r} is {rb.kind_of(value)}, not a tensor")
        out.append((name, value))
    return out


def _bucket(obj: Any) -> list[tuple[str, torch.Tensor]]:
    """SGLang's FlattenedTensorBucket: one flat tensor and each tensor's slice of it (element
    offsets into a tensor of their dtype, or byte offsets into a uint8 buffer)."""
    if type(obj) is not dict or set(obj) != {"flattened_tensor", "metadata"}:
        raise PayloadError(f"{WHERE} must decode to {{'flattened_tensor', 'metadata'}}")
    flat, metas = obj["flattened_tensor"], obj["metadata"]
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or not flat.is_contiguous():
        raise PayloadError(f"{WHERE}: flattened_tensor must be a contiguous 1-D tensor")
    if type(metas) is not list or not 0 < len(metas) <= MAX_ENTRIES:
        raise PayloadError(f"{WHERE}: metadata must be a non-empty list")
    out = []
    for meta in metas:
        if not isinstance(meta, Record) or meta.kind is not rb.FLAT_META or meta.values is None:
            raise PayloadError(f"{WHERE}: metadata must hold FlattenedTensorMetadata entries")
        m = meta.values
        start, end, dtype, shape = m["start_idx"], m["end_idx"], m["dtype"], m["shape"]
        per = dtype.itemsize if flat.dtype == torch.uint8 and dtype != torch.uint8 else 1
        if not start <= end <= flat.numel() or end - start != rb._numel(shape) * per:
            raise PayloadError(f"{WHERE}: {m['name'][:100]!r} does not fit its slice")
        part = flat[start:end]
        part = part.view(dtype) if per > 1 else part.to(dtype)
        out.append((m["name"], part.reshape(shape)))
    return out


def _safetensors(raw: bytes) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load

    try:
        return list(load(raw).items())
    except Exception as e:  # safetensors raises its own error types on a bad header
        raise PayloadError(f"{WHERE} is not a safetensors file: {e}") from None
