"""The tensor-payload decoder (maskgate/worker/rl/tensor_decode.py): the formats trainers send
decode to the right tensors, and a corpus of pickle gadget shapes is refused before anything
runs, with no side effect (no file written, no class attribute set)."""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing.reductions as reductions
from safetensors.torch import save

from maskgate.worker.rl.tensor_decode import decode, scan
from maskgate.worker.rl.tensor_rebuild import PayloadError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakes.trainer_payloads import (
    FlattenedTensorMetadata,
    LocalSerializedTensor,
    b64,
    sglang_names,
    shared,
)
from trainer_payloads import bucket, forking

LIMIT = 1 << 26
PATCHED = ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified")


# --- a small assembler for hand-made pickles ---------------------------------------------------


def g(module: str, name: str) -> bytes:
    return s(module) + s(name) + b"\x93"  # STACK_GLOBAL


def s(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def i(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)  # BININT


def call(func: bytes, *args: bytes) -> bytes:
    return func + b"(" + b"".join(args) + b"tR"  # MARK args TUPLE REDUCE


def pk(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def args_body(args: tuple[Any, ...]) -> bytes:
    """The opcodes of a protocol-3 pickle of `args` (no frames), without header and STOP."""
    return pickle.dumps(args, protocol=3)[2:-1]


# --- the formats trainers send -----------------------------------------------------------------


@pytest.fixture(name="sglang_modules")
def _sglang_modules() -> Iterator[None]:
    """SGLang's module names for the two dataclasses, so pickle writes them as SGLang does."""
    with sglang_names():
        yield


def test_direct_shared_memory_tensors() -> None:
    a, b = torch.randn(4, 3), torch.randn(5, dtype=torch.bfloat16)
    out = decode(b64(forking([("a", shared(a)), ("b", shared(b)[1:])])), None, LIMIT)
    assert [n for n, _ in out] == ["a", "b"]
    assert torch.equal(out[0][1], a) and torch.equal(out[1][1], b[1:])


def test_flattened_bucket_multi_dtype(sglang_modules: None) -> None:
    a, b = torch.randn(4, 3), torch.randn(2, 5, dtype=torch.bfloat16)
    out = decode(b64(forking(bucket([("a", a), ("b", b)]))), "flattened_bucket", LIMIT)
    assert out[0][0] == "a" and torch.equal(out[0][1], a)
    assert out[1][1].dtype == torch.bfloat16 and torch.equal(out[1][1], b)


def test_flattened_bucket_single_dtype(sglang_modules: None) -> None:
    """The older bucket: a flat tensor of the tensors' own dtype, element offsets."""
    a, b = torch.randn(2, 2), torch.randn(3)
    metas = [
        FlattenedTensorMetadata("a", a.shape, a.dtype, 0, 4, 4),
        FlattenedTensorMetadata("b", b.shape, b.dtype, 4, 7, 3),
    ]
    flat = shared(torch.cat([a.flatten(), b]))
    out = decode(
        b64(forking({"flattened_tensor": flat, "metadata": metas})), "flattened_bucket", LIMIT
    )
    assert torch.equal(out[0][1], a) and torch.equal(out[1][1], b)


def test_verl_local_serialized_tensor(sglang_modules: None) -> None:
    a = torch.randn(3, 2)
    inner = forking(shared(a))
    out = decode(b64(forking([("a", LocalSerializedTensor([inner]))])), None, LIMIT)
    assert torch.equal(out[0][1], a)


def test_safetensors_needs_no_pickle() -> None:
    a = torch.randn(3, 2, dtype=torch.bfloat16)
    out = decode(b64(save({"a": a})), "safetensors", LIMIT)
    assert out[0][0] == "a" and torch.equal(out[0][1], a)
    with pytest.raises(PayloadError, match="not a safetensors"):
        decode(b64(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}"), "safetensors", LIMIT)


def test_bucket_slices_are_checked(sglang_modules: None) -> None:
    a = torch.randn(4)
    bad = {
        "flattened_tensor": shared(a),
        "metadata": [FlattenedTensorMetadata("a", torch.Size([8]), a.dtype, 0, 8, 8)],
    }
    with pytest.raises(PayloadError, match="does not fit"):
        decode(b64(forking(bad)), "flattened_bucket", LIMIT)


def test_the_byte_budget_bounds_a_payload() -> None:
    with pytest.raises(PayloadError, match="past 1000 bytes"):
        decode(b64(forking([("a", shared(torch.randn(1000)))])), None, 1000)


# --- the gadget corpus -------------------------------------------------------------------------


class _Probe:
    """Shapes a pickle may take to reach code or state; each must be refused unrun."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def corpus(self) -> dict[str, bytes]:
        m = self.marker
        touch = f"open({m!r}, 'w').close()"
        shm = shared(torch.ones(4))
        ts = shm.untyped_storage()
        return {
            "builtins.eval": pk(call(g("builtins", "eval"), s(touch))),
            "builtins.exec": pk(call(g("builtins", "exec"), s(touch))),
            "builtins.__import__": pk(call(g("builtins", "__import__"), s("os"))),
            "getattr chain": pk(
                call(
                    call(
                        g("builtins", "getattr"),
                        call(g("builtins", "__import__"), s("os")),
                        s("system"),
                    ),
                    s(f"touch {m}"),
                )
            ),
            "os.system": pk(call(g("os", "system"), s(f"touch {m}"))),
            "posix.system": pk(call(g("posix", "system"), s(f"touch {m}"))),
            "subprocess.Popen": pk(call(g("subprocess", "Popen"), s(f"touch {m}"))),
            "text GLOBAL os.system": b"cos\nsystem\n(" + s(f"touch {m}") + b"tR.",
            "INST opcode": b"(" + s(f"touch {m}") + b"ios\nsystem\n.",
            "dotted name": pk(
                call(g("torch.multiprocessing.reductions", "os.system"), s(f"touch {m}"))
            ),
            "dotted via torch": pk(call(g("torch", "_utils.sys.modules.get"), s("os"))),
            "prefix rebuild_storage_empty": pk(
                call(
                    g("torch.multiprocessing.reductions", "rebuild_storage_empty"),
                    g("torch.storage", "UntypedStorage"),
                )
            ),
            "prefix rebuild_event": pk(
                call(g("torch.multiprocessing.reductions", "rebuild_event"), i(0), s("x"))
            ),
            "torch.empty": pk(call(g("torch", "empty"), i(1 << 20))),
            "torch.load": pk(call(g("torch", "load"), s(m))),
            "_rebuild_tensor_v2": pk(call(g("torch._utils", "_rebuild_tensor_v2"), i(0))),
            "numpy reconstruct": pk(call(g("numpy.core.multiarray", "_reconstruct"), i(0))),
            "numpy frombuffer": pk(call(g("numpy", "frombuffer"), s("x"))),
            "resource_sharer": pk(call(g("multiprocessing.resource_sharer", "DupFd"), i(0))),
            "shared-memory manager": pk(call(g("multiprocessing.managers", "SyncManager"))),
            "SharedMemory": pk(call(g("multiprocessing.shared_memory", "SharedMemory"), s("x"))),
            "REDUCE on torch.Tensor": pk(call(g("torch", "Tensor"), i(3))),
            "REDUCE on a dtype": pk(call(g("torch", "float32"), i(3))),
            "NEWOBJ on torch.Tensor": pk(g("torch", "Tensor") + b")\x81"),
            "BUILD class attribute on UntypedStorage": pk(
                g("torch.storage", "UntypedStorage")
                + b"N}"
                + s("maskgate_probe")
                + i(1)
                + b"s\x86b"
            ),
            "BUILD class attribute on Tensor": pk(
                g("torch", "Tensor") + b"N}" + s("maskgate_probe") + i(1) + b"s\x86b"
            ),
            "BUILD on a rebuilder": pk(
                g("torch.multiprocessing.reductions", "rebuild_tensor")
                + b"N}"
                + s("__defaults__")
                + b"Ns\x86b"
            ),
            "BUILD on a dtype": pk(g("torch", "float32") + b"}" + s("x") + i(1) + b"sb"),
            "persistent id": pk(s("x") + b"Q"),
            "oversized size": self.tensor((0, (1 << 20,), (1,), False), ts),
            "negative size": self.tensor((0, (-4,), (1,), False), ts),
            "oversized stride": self.tensor((0, (2, 2), (1 << 30, 1), False), ts),
            "offset past the end": self.tensor((5, (1,), (1,), False), ts),
            "too many dims": self.tensor((0, (1,) * 9, (1,) * 9, False), ts),
            "non-bool grad": self.tensor((0, (4,), (1,), 1), ts),
            "patched CUDA, bogus UUID": self.cuda(PATCHED, "GPU-bogus"),
            "CUDA, missing device": self.cuda(
                ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"), 7
            ),
            "CUDA, storage past its size": self.cuda(PATCHED, 0, size=(64,)),
            "CUDA, a dtype as storage class": self.cuda(PATCHED, 0, storage=torch.float32),
            "CUDA, torch's own form on a CPU-only worker": self.cuda(
                ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
                0,
                storage=torch.storage.TypedStorage,
            ),
        }

    @staticmethod
    def tensor(metadata: tuple[Any, ...], storage: torch.UntypedStorage) -> bytes:
        class Crafted:
            def __reduce__(self) -> tuple[Any, ...]:
                typed = torch.TypedStorage(
                    wrap_storage=storage, dtype=torch.float32, _internal=True
                )
                return reductions.rebuild_tensor, (torch.Tensor, typed, metadata)

        return forking([("a", Crafted())])

    @staticmethod
    def cuda(
        where: tuple[str, str], device: Any, size: Any = (4,), storage: Any = torch.UntypedStorage
    ) -> bytes:
        """SGLang's patched CUDA rebuild (or torch's), 15 arguments, 16 bytes of storage."""
        args = (
            torch.Tensor,
            size,
            (1,),
            0,
            storage,
            torch.float32,
            device,
            b"h\0" * 32,
            16,
            0,
            False,
            b"/torch_1_2_3",
            0,
            None,
            False,
        )
        module, name = where
        return b"\x80\x03c" + f"{module}\n{name}\n".encode() + args_body(args) + b"R."


def test_gadgets_are_refused_without_side_effects(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for name, raw in _Probe(marker).corpus().items():
        for load_format in (None, "flattened_bucket"):
            with pytest.raises(PayloadError) as e:
                decode(b64(raw), load_format, LIMIT)
            # refused by a check, not by a failure half-way through running it
            assert "cannot decode" not in str(e.value) and "not a valid" not in str(e.value)
        assert not marker.exists(), name
    for cls in (torch.UntypedStorage, torch.Tensor):
        assert not hasattr(cls, "maskgate_probe")
    assert reductions.rebuild_tensor.__defaults__ is None


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (pk(call(g("os", "system"), s("x"))), "names os.system"),
        (pk(call(g("torch", "_utils.sys"), s("x"))), "dotted names are never resolved"),
        (pk(call(g("multiprocessing.resource_sharer", "DupFd"), i(0))), "file_system"),
        (b"(S'x'\nios\nsystem\n.", "opcode"),
    ],
)
def test_the_scan_names_what_it_refuses(raw: bytes, needle: str) -> None:
    with pytest.raises(PayloadError, match=needle):
        scan(raw)


def test_the_scan_lists_the_globals_of_a_real_payload() -> None:
    names = scan(forking([("a", shared(torch.ones(2)))]))
    assert ("torch.multiprocessing.reductions", "rebuild_tensor") in names
    assert ("torch.storage", "UntypedStorage") in names
