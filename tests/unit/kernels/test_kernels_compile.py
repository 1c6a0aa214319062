"""The sampler's kernels lower for an H100/H200 (sm_90), without a GPU.

The interpreter tests run the kernels' logic in numpy; they do not lower them, so what only
the compiler sees (tuple reductions, layouts of the tier sorts, register limits) is checked
here, compiled to a cubin with the ptxas that ships with Triton (resolve at the target
shape: about 45 s on a 2-core machine).
"""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton")

from maskgate.kernels.triton.common import MUL_A  # noqa: E402
from maskgate.kernels.triton.config import (  # noqa: E402
    DELTA,
    FB_BLOCK,
    NBISECT,
    RESOLVE_REGS,
    RESOLVE_REGS_BATCH,
    band_config,
    reread_constants,
)
from maskgate.kernels.triton.launch import resolve_meta  # noqa: E402

POINTERS = {
    "x_ptr": "*fp32",
    "temp_ptr": "*fp32",
    "cand_key_ptr": "*i64",
    "m_ptr": "*fp32",
    "s_ptr": "*fp32",
    "d_ptr": "*fp32",
    "topk_ptr": "*i32",
    "topp_ptr": "*fp32",
    "minp_ptr": "*fp32",
    "bounded_ptr": "*i1",
    "seed_ptr": "*i64",
    "step_ptr": "*i64",
    "midx_ptr": "*i64",
    "tok_ptr": "*i64",
    "lp_ptr": "*fp32",
    "size_ptr": "*i64",
    "nan_ptr": "*i8",
    "fb_ptr": "*i8",
    "band_ptr": "*i64",
    "cnt_ptr": "*i64",
    "status_ptr": "*i8",
    "slot_ptr": "*i32",
    "offsets_ptr": "*i64",
    "ids_ptr": "*i32",
    "mask_sizes_ptr": "*i64",
    "scratch_ptr": "*i64",
    "g_ptr": "*fp32",
    "w_ptr": "*i64",
}
# band_lanes_kernel's race arguments (None when it does not race)
RACE_POINTERS = ("topk_ptr", "topp_ptr", "minp_ptr", "seed_ptr", "step_ptr", "g_ptr", "w_ptr")


def test_resolve_lowers_at_the_target_shape(sm90_compile: Any) -> None:
    """resolve_kernel at B = 1's shape for V = 151936 (2048 candidates, the 4096-token mask
    block): every phase of resolve_row (tiers, rescue, whole-row fallback, packing)."""
    from maskgate.kernels.triton.resolve import resolve_kernel

    vocab, cap = 151936, 4096
    cfg = band_config(vocab, batch=1)
    const = {**resolve_meta(cfg, vocab, cap, has_step=True), "PDL": True}
    types = {p: POINTERS.get(p, "i32") for p in resolve_kernel.arg_names}
    ptx = sm90_compile(resolve_kernel, types, const, num_warps=8).asm["ptx"]
    assert "griddepcontrol.wait" in ptx  # waits for pass 1 before reading its outputs
    assert "ld.volatile" in ptx or "ld.relaxed" in ptx  # pack_row's wait on earlier rows


@pytest.mark.parametrize(
    ("race", "reread", "look"),
    [(False, 0, 2), (True, 0, 2), (False, 16, 2), (False, 16, 1)],
)
def test_pass_one_lowers_for_sm90(race: bool, reread: int, look: int, sm90_compile: Any) -> None:
    """band_lanes_kernel at B = 128's shape for V = 151936, with the register limit it
    launches with (and two-token lanes that read collided columns again, the default from
    32 rows). Its end of segment keeps the lane tops in the loop's layout: no 64-bit value (a
    candidate's key) goes through shared memory. With the race of rows nothing truncates
    (as sample_triton launches it when a row asks for no mask), that race's winner is the
    one 64-bit value reduced through shared memory, once a segment and only on those rows.
    look 1: the loop reads one tile ahead, at 40 registers."""
    from maskgate.kernels.triton.pass1 import band_lanes_kernel

    cfg = band_config(151936, batch=128, reread=reread, look=look)
    const = {
        "SEG": cfg.chunk,
        "W": cfg.lanes,
        "KC": cfg.kc,
        "DELTA": DELTA,
        "NBISECT": NBISECT,
        "CLEAR": True,
        "PDL": True,
        "RACE": race,
        "HAS_STEP": True,
        **reread_constants(cfg),
        "LOOK": cfg.look,
    }
    if not race:
        const.update(dict.fromkeys(RACE_POINTERS))
    types = {p: POINTERS.get(p, "i32") for p in band_lanes_kernel.arg_names}
    assert cfg.regs == (48 if look == 2 else 40)  # two tiles read ahead take 48 registers
    ptx = sm90_compile(band_lanes_kernel, types, const, maxnreg=cfg.regs).asm["ptx"]
    assert "ex2.approx" in ptx  # the lanes' one exp2 a token
    assert f".maxnreg {cfg.regs}" in ptx
    assert "griddepcontrol.launch_dependents" in ptx  # resolve_kernel may launch early
    assert "griddepcontrol.wait" in ptx  # launched early itself, after the kernel before
    assert (str(MUL_A.value) in ptx) == race  # the race's keyed noise (a hash multiplier)
    if not race:
        stores = [line for line in ptx.splitlines() if "st.shared" in line]
        assert stores and not [line for line in stores if "b64" in line]


@pytest.mark.parametrize(("vocab", "batch"), [(1000, 64), (111, 512)])
def test_resolve_lowers_for_small_vocabularies(vocab: int, batch: int, sm90_compile: Any) -> None:
    """resolve_kernel where the candidate block is smaller than the rescue's 2048-token read
    (1024 and 128 candidates here), with the register cap band_config sets at 512 rows (the
    interpreter ignores it; at V = 151936 the capped compile ran past 5 minutes on a 2-core
    machine, too long for CI). The interpreter does not check that a name assigned
    before a loop keeps its type inside it; the compiler does, and a rescue that reused the
    candidates' names for its read blocks failed to compile for every vocabulary below
    about 4096 tokens (the worker's small models) while passing every interpreted test."""
    from maskgate.kernels.triton.resolve import resolve_kernel

    cfg = band_config(vocab, batch=batch)
    cand_block = triton.next_power_of_2(cfg.ncand)
    assert cand_block < FB_BLOCK
    assert cfg.resolve_regs == (RESOLVE_REGS if batch >= RESOLVE_REGS_BATCH else 0)
    const = {**resolve_meta(cfg, vocab, vocab, has_step=False), "PDL": True}
    types = {p: POINTERS.get(p, "i32") for p in resolve_kernel.arg_names}
    cap = {"maxnreg": cfg.resolve_regs} if cfg.resolve_regs else {}
    ptx = sm90_compile(resolve_kernel, types, const, num_warps=4, **cap).asm["ptx"]
    assert "griddepcontrol.wait" in ptx  # waits for pass 1 before reading its outputs
    assert (f".maxnreg {RESOLVE_REGS}" in ptx) == bool(cap)


def test_emit_lowers_once_for_every_row_count(sm90_compile: Any) -> None:
    """emit_kernel takes no block over the mask rows (its sum runs in pieces), so one compile
    serves every R and a worker's warm-up meets it with any batch that packs there."""
    from maskgate.kernels.triton.emit import emit_kernel

    assert not [p for p in emit_kernel.arg_names if p.startswith("R")]
    types = {"slot_ptr": "*i32", "cnt_ptr": "*i64", "offsets_ptr": "*i64", "ids_ptr": "*i32"}
    types["cap"] = "i32"
    ptx = sm90_compile(emit_kernel, types, {"BLOCK": 1024, "PDL": True}, num_warps=4).asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
