"""The CUDA sampler: Triton launches, no host synchronisation, no full vocabulary sort.

  band_lanes_kernel (B, n_chunks)  the one full read of the logits: per-segment stats and
                                   candidates (band_kernel, one program per 2048-token chunk,
                                   is the older pass 1: same contract, kept as a reference)
  resolve_kernel    (B,)           sort candidates, decide S (or bisect: fallback), draw, slots;
                                   up to one row an SM, each row also packs its slot as CSR
  emit_kernel       (R,)           pack the slots as CSR (R >= 2, more rows than SMs or fused)

band_resolve_kernel (B, n_chunks) runs the first two as one launch, on request (fused=True):
the program that finishes a row's last segment resolves the row (maskgate/kernels/triton_fused.py).

The only host-side inputs are shapes and want_mask (a CPU tensor: it sizes the outputs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from maskgate.kernels.inputs import SampleInputs
from maskgate.kernels.result import SampleResult
from maskgate.kernels.triton_band import band_kernel
from maskgate.kernels.triton_band_lanes import SHORT_TILES, TIME_FIELDS, band_lanes_kernel
from maskgate.kernels.triton_emit import emit_kernel
from maskgate.kernels.triton_fallback import HELP_WORDS
from maskgate.kernels.triton_fused import band_resolve_kernel
from maskgate.kernels.triton_resolve import resolve_kernel

CHUNK_MAX = 2048  # band_kernel's tokens per program
BAND_WARPS = 8
CAND_TARGET = 2048  # candidate keys per row that pass 1 keeps (at most)
KC_MIN = 16
DELTA = 12.0  # band depth below each chunk max, in nats (exp(-12) = 6e-6)
NBISECT = 6  # band threshold bisection steps: DELTA / 64 resolution is plenty
# band_lanes_kernel, the default pass 1: 512 lanes (2 per thread). Timed on the H200 from
# graph replays of 8 launches at V=151936 (bench_kernels.py --split): B=128 fp32 32.9 us
# (floor 21.4), B=1 5.0 us with 2048-token segments (floor 2.7). band_kernel took 162 us
# at B=128 (single replays, floor 29.1).
LANES = 512
# Segments double (up to MAX_TILES tiles) while the launch keeps LANE_PROGRAMS programs or the
# row keeps ROW_SEGMENTS segments: large batches amortise each program's end-of-segment cut
# and its start over more tokens (16384 at B=128, V=151936), B=1 still spreads its row over
# the SMs. A row keeps ROW_LANES lanes (19 segments at V=151936) unless the launch has
# FULL_PROGRAMS programs: fewer lanes a row put three of its top tokens in one lane more
# often, and such a row takes the rescue (bench_segments.py: 3 rescued rows in 512 at
# B=128 with 6 segments, none with 10). On the H200 (V=151936 fp32 top-p 0.95, steady,
# 3 rounds each) 512 programs against 1024: B=16 23.5 against 26.3 us (38 segments
# against 75), B=32 26.0 against 30.7 and B=48 31.3 against 37.2 (19 against 38); B=64 with
# 10 segments met a rescued row (44.5 against 34.5), so from B=54 the 19 stay.
LANE_PROGRAMS = 512
FULL_PROGRAMS = 1024
ROW_SEGMENTS = 64
ROW_LANES = 8192
# Whatever the launch size, a row keeps at least ROW_LANES_MIN lanes (or segments stop
# doubling). With |S| support tokens spread over L lanes a row, about C(|S|, 3) / L^2 rows
# put three in one lane: the rate depends on the lanes a row, not on V. V = 151936 keeps
# 5120 at any batch; V = 32000 at B = 512 had 2 segments of 16384 tokens (1024 lanes) and
# lost 6.6% of its top-p 0.95 Zipf rows to the rescue and bisection, 42x its floor
# steady (bench_kernels.py grid, session 12).
ROW_LANES_MIN = 4096
# And a row keeps more than ROW_LANES_MIN while the launch stays under MID_PROGRAMS. At
# V = 32000 and 128256 the halving from 16 to 8 segments a row (8192 to 4096 lanes) came at
# B = 128 (1024 programs), and a resolve wave waits for its slowest row. On the H200 (fp32
# top-p 0.95 Zipf rows, steady over the bench's four buffers, `--ab default,s2k` and
# `default,l512s8k`): V = 32000 B = 128 40.4 us with 8 segments against 32.5 with 16 (2
# rescued rows in 512 against none), B = 256 74.8 against 67.6; V = 128256 B = 128 84.3
# against 64.5 (6 rescued rows against 2), B = 256 106.4 against 97.5. From B = 384 (6144
# programs with 16) the longer shape won: B = 384 79.3 against 86.0 and 126.4 against 150.3
# (`--ab default,s4k` and `default,s16k`, one round, 4 and 5 rescued rows in 1536 with 8
# segments against 0 and 13 with 16; session 15), B = 512 109.2 against 135.4 and 152.8
# against 166.9. So the step comes at B = 384 (B = 257-383 untimed). V = 151936 halves
# from 19 segments to 10 (5120 lanes) and keeps its shape.
MID_PROGRAMS = 3072
# 16-bit logits take the same shape. A 16-bit shape (1024 lanes, 65536-token segments: 3 per
# row at B=128, V=151936) streamed faster (pass 1 44.3 us against 60.4 in bf16 on the H200),
# but its 3072 lanes per row, against 5120, put three of a row's top tokens in one lane about
# 2.8 times as often, and 3 segments leave the rescue little to work with: 0.8% of bf16
# Zipf rows at top-p 0.95 took the bisection fallback, and a launch with one such row took
# 252 us instead of 59 (bench_kernels.py --quick). The fp32 shape had no fallback rows there.
# Segments stop at 32 tiles (16384 tokens): from B = 205 at V = 151936 (B = 128 at 128256)
# 64 tiles gave 5 (4) segments a row, 2560 (2048) lanes, and with 512 lanes x 32768 tokens
# 0.39% of Zipf rows took the bisection fallback on the H200 (B = 128, top-p 0.95): the whole
# sample averaged 137.6 us against 46.2 with 16384 (bench_kernels.py --split, session 7). At
# B = 512 that is about two such rows in every launch.
MAX_TILES = 32
# On request (band_config(long_segments=True)), with the reread on, a segment of MAX_TILES
# tiles doubles once more, to LONG_TILES, while the row keeps LONG_ROW_LANES lanes and the
# launch LANE_PROGRAMS programs: V = 151936 would take 5 segments a row from 103 rows and
# 262144 8 from 64. Such a launch reads collided lanes again below REREAD_BELOW_LONG tops
# (`bench/reread_probe.py`: 5 segments a row at V = 151936 leave 67 of 4096 Zipf rows to the
# rescue without the reread, 17 at 20 tops, none at 32) and starts pass 1 without its PDL
# wait (with it, a one-wave pass 1 of 5 segments lost to PDL: B = 128 47.45-47.61 us,
# session 21). On the H200 (V = 151936 fp32 top-p 0.95 Zipf rows, steady, 16 buffers,
# session 22) it was faster: B = 104 40.76-40.95 -> 38.38-38.74 us, 128 45.03-45.09 ->
# 42.57-42.74, 256 80.02-80.06 -> 78.02-78.48, 512 139.03-139.64 -> 137.35-137.64; V = 262144
# B = 64 42.5-42.7 -> 39.7-40.0, 512 201.5 -> 189.4-189.6. It is not the default because of
# wide supports: on Gaussian rows (standard deviation 5, top-p 0.95, the CPU count of
# reread_probe.py) it sends 40 of 1024 rows at V = 151936 to the whole-row fallback (about
# 1 ms a row) against 1 with 16384-token segments, and 30 of 512 against 9 at V = 262144:
# one such row holds its whole launch, so a few wide rows in ten thousand cost more than
# the 2.5-3 us it saves a launch.
LONG_TILES = 64
LONG_ROW_LANES = 2560
REREAD_BELOW_LONG = 32
# Registers per thread for pass 1 (ptxas .maxnreg) while a thread holds at most 2 lanes: its
# loop needs about 40, its end-of-segment reductions would take 64, and an SM holds 6
# programs of 40 but only 4 of 64 (at 40 the sm_90 code does not spill). On the H200, B=128
# fp32: 32.9 us at 40, 33.5 at 64 (bench variant n0).
PASS1_REGS = 40
# Pass 1's loop reads LOOK tiles ahead of its work where a segment is longer than the
# SHORT_TILES that are read whole (B >= 27 at V = 151936): each program then keeps twice the
# bytes in flight, at PASS1_REGS_LOOK registers (5 programs an SM). On the H200 (fp32 top-p
# 0.95 Zipf rows, steady, two alternating rounds, bench/row_stream.py --variants, session
# 35) the whole sample went from 25.9 to 24.4 us at B = 32, 36.2 to 34.6 at 64, 46.1 to
# 44.2-44.9 at 128, 76.4 to 75.3 at 256 and 135.6 to 134.7 at 512 (V = 151936); 33.7 to
# 33.4 at V = 32000 and 62.7 to 61.6 at 262144 (B = 128). Two tiles ahead at 40 registers
# gained about half as much, three at 40, 48 or 56 less, and 48 registers alone 0.6 us.
LOOK = 2
PASS1_REGS_LOOK = 48
RESOLVE_BISECT = 8  # halvings of the threshold search picking a tier's best (done in quarters)
TIERS = (256, 1024)  # candidates sorted per row: most rows decide on the first tier
# The rescue gathers up to this many second tiers of keys above its floor, then picks the
# best second tier of them (maskgate/kernels/triton_resolve.py).
RESCUE_TIERS = 4
# Rounds of the rescue at most: round r reads the r segments with the highest floors again
# (two bad segments in one row were one rescued row in five at B = 256 on the H200).
RESCUE_ROUNDS = 3
FB_BLOCK = 2048
# Largest mask a row may emit on CUDA: the fallback sorts up to this many keys in registers.
MAX_CAP = 16384


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b) (triton.cdiv is a constexpr function since triton 3.5: a few us
    of host time a call)."""
    return -(-a // b)


# A lane keeps its two largest tokens; three of a row's support in one lane put the band floor
# inside the support, and resolve rescues the row by reading a segment again, which holds
# the whole launch (0.24-0.29% of Zipf rows at V = 151936 and B = 128-192). From REREAD_BATCH
# rows pass 1 prevents it: a lane that let a band token go, below fewer than REREAD_BELOW of
# the segment's tops, reads its column again at the end of the segment. On the H200 (fp32,
# top-p 0.95, steady, bench_kernels.py --ab default,rr16 --buffers 16: rows at the rescue's
# rate, not the four buffers' luck): B = 32 28.1 -> 27.1 us, 64 36.5 -> 35.7, 100 48.7 ->
# 45.4, 128 54.9-55.1 -> 45.1-45.2 (5 rescued rows of 2048 -> 0), 192 78.8-78.9 -> 68.7-68.8
# (9 -> 1); B = 256 105.2 -> 80.8 and 512 165.5 -> 145.9 (four buffers, none left). The
# buffers share their first rows across batch sizes: B = 32's gain is one rescued row. Below
# it the reread's branch costs about 1 us and the short segments of small batches met no
# rescue in 16 buffers: B = 1 12.9 -> 13.8, 8 19.4 -> 20.4, 16 22.9 -> 23.9 (17-31 untimed).
# 32 tops instead of 16 cost more (B = 256 82.5, 512 149.0), 8 leave rows to the rescue
# (98.9 and 157.7).
REREAD_BATCH = 32
REREAD_BELOW = 16
REREAD_LANES = 8  # collided lanes a segment reads again at most (one [8, tiles] block)
# resolve_kernel compiles to 255 registers a thread on sm_90 (its rescue gathers four tiers
# of keys), one program an SM, so past one row an SM it runs in waves. From
# RESOLVE_REGS_BATCH rows it is capped at RESOLVE_REGS: two programs an SM. The cap makes
# each row slower (B = 128 with the reread off, one wave: 43.8 -> 48.9 us steady; B = 1
# 13.0 -> 13.4), and the rescue's rows most (session 9), but past one wave the second
# program an SM repays it where the reread leaves the rescue almost no rows. On the H200
# (fp32, top-p 0.95, steady, no rescued row in the buffers): B = 256 80.2-80.4 -> 77.6-77.7
# us, B = 512 145.1 -> 137.0, B = 1024 276.3-276.8 -> 254.9-255.8; B = 192 (the reread off,
# rescued rows in two of four buffers) 85.1 -> 86.4. With the reread on, the cap also wins
# at 133-255 rows (16 buffers, session 22): B = 160 58.98-59.03 -> 56.30, 192 68.61-68.65 ->
# 66.77-66.81, 224 74.37-74.58 -> 73.76-73.79; so it starts past one row an SM of the H200.
RESOLVE_REGS_BATCH = 133
RESOLVE_REGS = 128


def next_pow2(n: int) -> int:
    """Host-side smallest power of two >= n (n >= 1), like triton.next_power_of_2."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class BandConfig:
    chunk: int  # tokens per pass-1 program (a segment of band_lanes_kernel)
    kc: int  # candidate slots per chunk
    n_chunks: int
    lanes: int = 0  # > 0: band_lanes_kernel with this many lanes; 0: band_kernel
    resolve_warps: int = 0  # resolve_kernel's warps; 0 picks by candidate count
    fused: bool = False  # one launch: the last segment of a row resolves it (lanes only)
    warps: int = BAND_WARPS  # pass 1's warps (lanes only; the fused launch keeps BAND_WARPS)
    keep: int = 2  # tokens a pass-1 lane keeps, 2 or 3 (lanes only)
    # keep 2: lanes that let a band token go read their column again when fewer than this
    # many tops lie above it (0: never)
    reread: int = 0
    regs: int = 0  # pass 1's registers per thread (lanes only, not fused); 0: the compiler's
    pdl: bool = True  # programmatic dependent launches between the split path's kernels (sm_90+)
    # pdl: pass 1 too launches early behind the kernel before it and waits for it on the
    # device; off, it starts once that kernel ends (and still lets resolve launch early)
    band_wait: bool = True
    pack: bool = True  # split path, up to one row an SM: resolve packs the CSR (no emit launch)
    resolve_regs: int = 0  # resolve_kernel's registers per thread (.maxnreg); 0: the compiler's
    early: bool = True  # the first tier's pick stops once it holds the support (best_sorted)
    race: bool = True  # pass 1 races the rows nothing truncates (lanes, not fused)
    look: int = 1  # tiles pass 1's loop reads ahead of its work (lanes, not fused): 1-3
    # the whole-row fallback's counting reads go in parts, which rows waiting on the pack
    # path take too (triton_fallback._above3, help_one). Off by default: on real rows at
    # top-p 0.95 it timed 13-15% faster (a fifth of them take that fallback), on the
    # benchmark's Zipf rows, where none does, 1-2 us slower (sessions 38-39, docs/kernels.md)
    shared_reads: bool = False
    # with shared_reads on the pack path: resolve's grid has this many waves of extra
    # programs (sm_count each) after the rows, which only help the rows' reads
    # (triton_emit.help_rows): the SMs of rows that finished early, or that no row has
    help_waves: int = 0
    # with shared_reads: the fallback's listing read (_cut_listed) goes in parts too
    shared_lists: bool = True

    @property
    def ncand(self) -> int:
        return self.n_chunks * self.kc


def reread_constants(cfg: BandConfig) -> dict[str, int]:
    """band_lanes_kernel's reread constexprs for a config: its threshold (0: no reread), the
    collided lanes a segment reads again at most and its tiles, rounded up to a power of
    two."""
    return {
        "REREAD_BELOW": cfg.reread,
        "REREAD_LANES": REREAD_LANES,
        "REREAD_TILES": next_pow2(cdiv(cfg.chunk, cfg.lanes)),
    }


def band_config(
    vocab: int,
    chunk: int | None = None,
    kc: int | None = None,
    lanes: int | None = None,
    batch: int = 1,
    resolve_warps: int = 0,
    fused: bool = False,
    warps: int = 0,
    keep: int = 2,
    reread: int | bool | None = None,
    long_segments: bool = False,
    regs: int | None = None,
    pdl: bool = True,
    band_wait: bool | None = None,
    resolve_regs: int | None = None,
    pack: bool = True,
    programs: int = LANE_PROGRAMS,
    early: bool = True,
    race: bool = True,
    look: int | None = None,
    shared_reads: bool = False,
    help_waves: int = 0,
    shared_lists: bool = True,
) -> BandConfig:
    """Pass 1's shape for a vocabulary and batch size (tests shrink chunk and kc).

    The segment of band_lanes_kernel grows with the batch, so a worker meets a few configs
    (powers of two of tiles) per vocabulary; each compiles its own pass 1 once (programs:
    the launch size segments keep doubling for, lanes_segment; the bench's p1024 variant
    is the rule before session 10). fused (one launch for both passes, band_resolve_kernel)
    is off by default: compiled for sm_90 it takes 255 registers a thread, one program an
    SM, and the separate launches with PDL beat it on the H200 (V = 151936 fp32 top-p 0.95,
    steady, 5 rounds in one process: B = 1 12.85-12.86 us split against 14.76-15.45 fused;
    B = 2 15.06-15.08 against 20.5-21.8, its 150 programs two waves of the fused kernel).
    look: tiles pass 1's loop reads ahead (None: LOOK where a segment is longer than the
    SHORT_TILES read whole, else 1); regs None then follows it (PASS1_REGS_LOOK or PASS1_REGS).
    """
    if lanes is None:
        lanes = LANES
    rereads = keep == 2 and bool(lanes) and not fused
    if reread is None and not (batch >= REREAD_BATCH and rereads):
        reread = 0
    long = False
    if lanes and chunk is None:
        lanes = min(lanes, next_pow2(vocab))
        chunk = lanes_segment(vocab, lanes, batch, programs)
        long = long_segments and reread != 0 and rereads
        long = long and long_segment(vocab, lanes, batch, chunk, programs)
        if long:
            chunk *= 2
    chunk = chunk or min(CHUNK_MAX, next_pow2(vocab))
    n_chunks = cdiv(vocab, chunk)
    if kc is None:
        per_chunk = max(KC_MIN, CAND_TARGET // n_chunks)
        kc = min(chunk, 1 << (per_chunk.bit_length() - 1))  # a power of two for tl.arange
    if fused and not lanes:
        raise ValueError("fused needs the lanes pass 1 (lanes > 0)")
    if keep not in (2, 3):
        raise ValueError(f"keep must be 2 or 3 (tokens a pass-1 lane keeps), got {keep}")
    if reread is None:
        reread = REREAD_BELOW_LONG if long else REREAD_BELOW
    elif reread is True:
        reread = REREAD_BELOW
    if reread and not rereads:
        raise ValueError("reread needs the two-token lanes pass 1 of the split launch")
    if band_wait is None:
        band_wait = not long
    if resolve_regs is None:
        resolve_regs = RESOLVE_REGS if batch >= RESOLVE_REGS_BATCH and not fused else 0
    lanes = min(lanes, chunk)
    warps = warps or BAND_WARPS
    if look is None:  # segments of at most SHORT_TILES tiles are read whole
        look = LOOK if lanes and not fused and chunk // lanes > SHORT_TILES.value else 1
    if help_waves < 0 or (help_waves and not shared_reads):
        raise ValueError(f"help_waves needs shared_reads and is >= 0, got {help_waves}")
    if look not in (1, 2, 3) or (look > 1 and (fused or not lanes)):
        raise ValueError(f"look must be 1, 2 or 3, and 1 for band_kernel or fused, got {look}")
    if regs is None:
        regs = (PASS1_REGS_LOOK if look > 1 else PASS1_REGS) if lanes <= 64 * warps else 0
    return BandConfig(
        chunk=chunk,
        kc=kc,
        n_chunks=n_chunks,
        lanes=lanes,
        resolve_warps=resolve_warps,
        fused=fused,
        warps=warps,
        keep=keep,
        reread=int(reread),
        regs=regs,
        pdl=pdl,
        band_wait=band_wait,
        resolve_regs=resolve_regs,
        pack=pack,
        early=early,
        race=race,
        look=look,
        shared_reads=shared_reads and not fused,
        help_waves=help_waves if shared_reads and not fused else 0,
        shared_lists=shared_lists,
    )


# band_config keyword arguments kernels.sample's CUDA path adds, process-wide (use_shared_reads)
_SAMPLE_OPTIONS: dict[str, bool] = {}


def use_shared_reads(on: bool) -> None:
    """From now on, in this process, kernels.sample's CUDA path shares the whole-row
    fallback's reads (band_config's shared_reads) or not (the default). On: 13-15% faster on
    a real model's rows at top-p 0.95, where about a fifth of the rows take that fallback;
    1-2 us slower a launch where none does (docs/kernels.md). A worker sets it once, before
    its warm-up (its mask_shared_reads setting)."""
    _SAMPLE_OPTIONS["shared_reads"] = on
    default_config.cache_clear()


@functools.lru_cache(maxsize=1024)
def default_config(vocab: int, batch: int) -> BandConfig:
    """band_config(vocab, batch=batch) with use_shared_reads's choice, computed once per
    shape (kernels.sample's path)."""
    return band_config(vocab, batch=batch, **_SAMPLE_OPTIONS)


def may_pack(cfg: BandConfig, batch: int, device: torch.device) -> bool:
    """Whether a launch of `batch` rows under cfg packs the CSR in resolve when more than one
    row asks for a mask (pack 2): split launches of up to one row an SM."""
    return cfg.pack and bool(cfg.lanes) and not cfg.fused and 1 < batch <= sm_count(device)


def compile_key(vocab: int, batch: int, device: torch.device) -> tuple[BandConfig, bool]:
    """What kernels.sample's compiled kernels depend on at a batch size: the config, and with
    shared reads whether the launch may pack (resolve's HELP). Equal keys, same compiles (the
    worker's warm-up meets each key once)."""
    cfg = default_config(vocab, batch)
    return cfg, cfg.shared_reads and may_pack(cfg, batch, device)


def long_segment(vocab: int, lanes: int, batch: int, chunk: int, programs: int) -> bool:
    """Whether a segment of lanes_segment's MAX_TILES tiles doubles once more (LONG_TILES)."""
    if chunk // lanes != MAX_TILES or 2 * MAX_TILES > LONG_TILES:
        return False
    segments = cdiv(vocab, 2 * chunk)
    return segments * lanes >= LONG_ROW_LANES and batch * segments >= programs


def lanes_segment(vocab: int, lanes: int, batch: int, programs: int = LANE_PROGRAMS) -> int:
    """Tokens per band_lanes_kernel program: a power-of-two number of tiles of lanes."""
    tiles = 1
    while tiles < MAX_TILES:
        segments = cdiv(vocab, 2 * tiles * lanes)  # per row, after doubling
        if segments * lanes < ROW_LANES_MIN:
            break
        if segments * lanes <= ROW_LANES_MIN and batch * segments < MID_PROGRAMS:
            break
        if batch * segments < programs and segments < ROW_SEGMENTS:
            break
        if segments * lanes < ROW_LANES and batch * segments < FULL_PROGRAMS:
            break
        tiles *= 2
    return tiles * lanes


_PDL: dict[torch.device, bool] = {}


def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch needs a CUDA device of compute capability 9 or more."""
    if device.type != "cuda":
        return False
    if device not in _PDL:
        _PDL[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return _PDL[device]


_SMS: dict[torch.device, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; the interpreter (CPU) runs programs one
    at a time in order, so any batch counts as resident there."""
    if device.type != "cuda":
        return 1 << 62
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


_ARRIVALS: dict[tuple[torch.device, int], torch.Tensor] = {}
_HELP: dict[tuple[torch.device, int], torch.Tensor] = {}


def _kept_zeros(cache: dict, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[>= numel] zeros for a kernel that leaves them fit for its next launch, cached per
    device and stream (launches on one stream are ordered, so they can share them); inside a
    CUDA graph capture a fresh buffer belongs to the graph instead."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(numel, dtype=dtype, device=device)
        key = (device, torch.cuda.current_stream(device).cuda_stream)
    else:
        key = (device, 0)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.zeros(max(numel, 64), dtype=dtype, device=device)
        cache[key] = buf
    return buf


def arrival_counters(batch: int, device: torch.device) -> torch.Tensor:
    """[>= batch] int32 zeros for band_resolve_kernel, which leaves them zero again."""
    return _kept_zeros(_ARRIVALS, batch, torch.int32, device)


def shared_level(cfg: BandConfig) -> int:
    """resolve_kernel's SHARED: 0 off, 1 the fallback's counting reads in parts, 2 its
    listing read too."""
    return (1 + cfg.shared_lists) if cfg.shared_reads else 0


def help_programs(cfg: BandConfig, pack: int, device: torch.device) -> int:
    """resolve_kernel's extra programs after the rows (band_config's help_waves, pack 2 with
    shared reads): sm_count a wave. The interpreter runs programs one at a time in order, so
    its extra programs find every row packed at once: two a wave there keep that path run."""
    if pack != 2 or not cfg.shared_reads:
        return 0
    return cfg.help_waves * (sm_count(device) if device.type == "cuda" else 2)


def help_words(batch: int, device: torch.device) -> torch.Tensor:
    """[>= batch * HELP_WORDS] int64 for resolve_kernel's shared reads (triton_fallback's
    _above3 and help_one). Every read closes its row's claim word before it returns, so the
    kernel leaves each below OPEN (stray claims on a closed read add a few), which is all the
    next launch needs; the other words are written before a read is opened."""
    return _kept_zeros(_HELP, batch * HELP_WORDS.value, torch.int64, device)


def max_chunks(vocab: int, cfg: BandConfig) -> int:
    """The most chunks any batch size gives this vocabulary under cfg's kind of pass 1, so
    resolve_kernel's block of chunk statistics (a compile-time size) does not change with B."""
    return cdiv(vocab, cfg.lanes) if cfg.lanes else cfg.n_chunks


def launch_band(
    x: torch.Tensor,
    temperature: torch.Tensor,
    cand_key: torch.Tensor,
    m_c: torch.Tensor,
    s_c: torch.Tensor,
    d_c: torch.Tensor,
    cfg: BandConfig,
    nbisect: int = NBISECT,
    pdl: bool = False,
    mask_sizes: torch.Tensor | None = None,
    race: dict | None = None,
    times: torch.Tensor | None = None,
) -> None:
    """Pass 1: one program per segment (band_lanes_kernel) or per chunk (band_kernel). pdl
    (band_lanes_kernel only): a programmatic dependent launch of the kernel before, and the
    primary of the next (resolve_kernel). mask_sizes (band_lanes_kernel only): [B] int64,
    set to -1 for resolve_kernel's packing. race (band_lanes_kernel only): the keyword
    arguments of its Gumbel race over the rows nothing truncates (see sample_triton).
    times (band_lanes_kernel only, CUDA): [B * n_chunks, TIME_FIELDS] int64, each program's
    start and end on the global timer (ns) and its SM's cycle counter, its SM, whether it
    read lanes again, and the cycle counter at its loop's end and at the start and end of
    its read again (0 where it read nothing; bench/pass1_timeline.py)."""
    batch, vocab = x.shape
    if times is not None and (
        not cfg.lanes or times.shape != (batch * cfg.n_chunks, TIME_FIELDS.value)
    ):
        raise ValueError(
            f"times must be [{batch * cfg.n_chunks}, {TIME_FIELDS.value}] int64 for the lanes "
            f"pass 1, got {tuple(times.shape)} (lanes={cfg.lanes})"
        )
    common = (x, temperature, cand_key, m_c, s_c, d_c, x.stride(0), vocab, cfg.n_chunks)
    consts = {"KC": cfg.kc, "DELTA": DELTA, "NBISECT": nbisect}
    if cfg.lanes > 0:
        band_lanes_kernel[(batch, cfg.n_chunks)](
            *common,
            SEG=cfg.chunk,
            W=cfg.lanes,
            **consts,
            KEEP=cfg.keep,
            **reread_constants(cfg),
            mask_sizes_ptr=mask_sizes,
            CLEAR=mask_sizes is not None,
            PDL=pdl,
            PDL_WAIT=cfg.band_wait,
            LOOK=cfg.look,
            **(race or {}),
            **({"times_ptr": times, "TIMES": True} if times is not None else {}),
            num_warps=cfg.warps,
            **({"maxnreg": cfg.regs} if cfg.regs else {}),
            **({"launch_pdl": True} if pdl and cfg.band_wait else {}),
        )
    else:
        band_kernel[(batch, cfg.n_chunks)](*common, CHUNK=cfg.chunk, **consts, num_warps=BAND_WARPS)


def mask_index(want_mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[B + R] int64 on device: each row's mask index (-1: none), then the R requesting rows.

    Built on the host from want_mask and copied without waiting for the device.
    """
    batch = want_mask.shape[0]
    rows = want_mask.nonzero().squeeze(1)
    index = torch.full((batch + rows.numel(),), -1, dtype=torch.int64)
    index[rows] = torch.arange(rows.numel())
    index[batch:] = rows
    return index.to(device, non_blocking=True)


def sample_triton(
    inp: SampleInputs,
    config: BandConfig | None = None,
    index: torch.Tensor | None = None,
    band_sizes: torch.Tensor | None = None,
    phase_cycles: torch.Tensor | None = None,
) -> SampleResult:
    """kernels.sample on the Triton path (CUDA tensors, or CPU under TRITON_INTERPRET=1).

    index: a precomputed mask_index (lets a caller capture the launches in a CUDA graph).
    band_sizes: optional [B] int64 out, candidates listed above the band floor (benchmark).
    phase_cycles: optional [B, PHASES] int64 out, CUDA only: each row's resolve stamps the SM's
    cycle counter at its phase boundaries (benchmark; a separate compile of resolve).
    """
    x = inp.logits
    batch, vocab = x.shape
    dev = x.device
    cfg = config or default_config(vocab, batch)
    cap = min(inp.max_mask_tokens, vocab)
    if cap > MAX_CAP:
        raise ValueError(
            f"max_mask_tokens {inp.max_mask_tokens} exceeds {MAX_CAP}, the largest mask the "
            "CUDA sampler emits; lower max_mask_tokens"
        )
    if index is None:
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "capturing kernels.sample in a CUDA graph needs index=mask_index(want_mask, "
                "device), built before the capture (its host-to-device copy cannot be captured)"
            )
        index = mask_index(inp.want_mask, dev)
    n_rows = index.shape[0] - batch
    midx, mask_rows = index[:batch], index[batch:]
    if band_sizes is None:
        band_sizes = torch.empty(batch, dtype=torch.int64, device=dev)

    cand_key = torch.empty(batch, cfg.ncand, dtype=torch.int64, device=dev)
    m_c, s_c, d_c = (torch.empty(batch, cfg.n_chunks, device=dev) for _ in range(3))
    tokens = torch.empty(batch, dtype=torch.int64, device=dev)
    logprobs = torch.empty(batch, dtype=torch.float32, device=dev)
    sizes = torch.empty(batch, dtype=torch.int64, device=dev)
    nan_rows = torch.empty(batch, dtype=torch.int8, device=dev)
    fallback = torch.empty(batch, dtype=torch.int8, device=dev)
    counts = torch.empty(max(n_rows, 1), dtype=torch.int64, device=dev)
    status = torch.empty(n_rows, dtype=torch.int8, device=dev)
    slots = torch.empty(max(n_rows, 1) * cap, dtype=torch.int32, device=dev)
    cap_block = next_pow2(cap)
    cand_block = next_pow2(cfg.ncand)
    t1, t2 = (min(t, cand_block) for t in TIERS)
    rescue = RESCUE_TIERS * t2
    scratch = torch.empty(batch, t1 + t2 + max(cap_block, rescue), dtype=torch.int64, device=dev)
    if inp.seed is None:
        seed = torch.randint(-(2**63), 2**63 - 1, (batch,), dtype=torch.int64, device=dev)
    else:
        seed = inp.seed
    step = inp.step if inp.step is not None else seed
    # CSR: resolve's row 0 writes offsets[0]. A single mask row needs no packing: its slot is
    # already mask_ids, resolve writes its count to offsets[1] too. Otherwise resolve's rows
    # pack their own slots (pack 2: split launches of up to one row an SM; pass 1 sets
    # mask_sizes to -1 first), or emit_kernel packs them after.
    offsets = torch.empty(n_rows + 1, dtype=torch.int64, device=dev)
    packs = may_pack(cfg, batch, dev)
    if n_rows == 1:
        pack = 1
    elif n_rows > 1 and packs:
        pack = 2
    else:
        pack = 0
    mask_ids = slots if n_rows == 1 else torch.empty(n_rows * cap, dtype=torch.int32, device=dev)
    # Pass 1 clears mask_sizes whether or not resolve packs: one pass-1 compile per config.
    mask_sizes = torch.empty(batch, dtype=torch.int64, device=dev)
    row_args = (
        inp.top_k,
        inp.top_p,
        inp.min_p,
        inp.bounded,
        seed,
        step,
        midx,
        tokens,
        logprobs,
        sizes,
        nan_rows,
        fallback,
        band_sizes,
        counts,
        status,
        slots,
        offsets,
        pack,
        mask_ids,
        mask_sizes,
        scratch,
        help_words(batch, dev) if cfg.shared_reads else scratch,  # a stand-in, never read
    )
    resolve_meta = {
        "CAND_BLOCK": cand_block,
        "NCH_BLOCK": next_pow2(max(cfg.n_chunks, max_chunks(vocab, cfg))),
        "T1": t1,
        "T2": t2,
        "CAP_BLOCK": cap_block,
        "RESCUE": rescue,
        "RESCUE_ROUNDS": RESCUE_ROUNDS,
        "FB_BLOCK": FB_BLOCK,
        "NBISECT": RESOLVE_BISECT,
        "HAS_STEP": inp.step is not None,
        "times_ptr": tokens if phase_cycles is None else phase_cycles,
        "TIMING": phase_cycles is not None,
        "EARLY": cfg.early,
        "SHARED": shared_level(cfg),
    }
    stats = (cand_key, m_c, s_c, d_c)
    # Rows nothing truncates (plain temperature sampling) draw from the whole row: pass 1 runs
    # their Gumbel race segment by segment (g: each winner's z + g; w: its (z, id) key, then
    # the segment's count of finite tokens), and resolve takes the best segment winner, with
    # no read of the row in one program. Only rows that ask for no mask are raced (a plain
    # row's mask is the whole row, which resolve reads in any case), so a launch whose rows
    # all ask for masks (a mask pool's batches) compiles pass 1 without the race: its check
    # at the end of every segment, taken or not, cost every row 5% on the H200 (B = 128,
    # V = 151936 fp32: 46.3 us steady against 43.9; B = 1: 13.5 against 13.2). resolve_kernel
    # takes `raced` at run time and stand-ins for the buffers when there is no race.
    raced = cfg.race and bool(cfg.lanes) and not cfg.fused and n_rows < batch
    race_g, race_w = m_c, cand_key
    race = None
    if raced:
        race_g = torch.empty(batch, cfg.n_chunks, device=dev)
        race_w = torch.empty(2, batch, cfg.n_chunks, dtype=torch.int64, device=dev)
        race = {
            "topk_ptr": inp.top_k,
            "topp_ptr": inp.top_p,
            "minp_ptr": inp.min_p,
            "seed_ptr": seed,
            "step_ptr": step,
            "g_ptr": race_g,
            "w_ptr": race_w,
            "RACE": True,
            "HAS_STEP": inp.step is not None,
        }
    # Programmatic dependent launch (sm_90+): resolve and emit launch while the kernel before
    # them finishes and wait for it on the device, so no launch gap separates the passes.
    pdl = cfg.pdl and pdl_capable(dev)
    if cfg.fused:
        band_resolve_kernel[(batch, cfg.n_chunks)](
            x,
            inp.temperature,
            *stats,
            x.stride(0),
            vocab,
            cfg.n_chunks,
            arrival_counters(batch, dev),
            *row_args,
            inp.max_mask_tokens,
            cap,
            cfg.ncand,
            SEG=cfg.chunk,
            W=cfg.lanes,
            KC=cfg.kc,
            DELTA=DELTA,
            BAND_BISECT=NBISECT,
            KEEP=cfg.keep,
            **resolve_meta,
            num_warps=BAND_WARPS,
        )
    else:
        launch_band(x, inp.temperature, *stats, cfg, pdl=pdl, mask_sizes=mask_sizes, race=race)
        resolve_kernel[(batch + help_programs(cfg, pack, dev),)](
            *stats,
            x,
            x.stride(0),
            inp.temperature,
            *row_args,
            vocab,
            cfg.n_chunks,
            inp.max_mask_tokens,
            cap,
            cfg.ncand,
            cfg.chunk,
            batch,
            **resolve_meta,
            PDL=pdl,
            g_ptr=race_g,
            w_ptr=race_w,
            raced=int(raced),
            # published reads and helping rows: compiled for the batch sizes that may pack
            # (the pack a launch takes depends on its mask rows, which a compile must not);
            # the fused kernel has no such parameter (it never packs)
            HELP=packs and cfg.shared_reads,
            num_warps=cfg.resolve_warps or (8 if cand_block >= 2048 else 4),
            **({"maxnreg": cfg.resolve_regs} if cfg.resolve_regs else {}),
            **({"launch_pdl": True} if pdl else {}),
        )

    if pack == 0 and n_rows > 1:
        emit_kernel[(n_rows,)](
            slots,
            counts,
            offsets,
            mask_ids,
            cap,
            BLOCK=1024,
            PDL=pdl,
            num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )
    return SampleResult(
        tokens=tokens,
        logprobs=logprobs,
        mask_rows=mask_rows,
        mask_offsets=offsets,
        mask_ids=mask_ids,
        mask_status=status,
        nan_rows=nan_rows.view(torch.bool),
        fallback_rows=fallback.view(torch.bool),
        support_sizes=sizes,
        chunk_max=m_c,
        chunk_sumexp=s_c,
    )
