"""The CUDA sampler's launch shapes: pass 1's segment, lanes and candidate slots, and the
register limits of both passes, for a vocabulary and a batch size.

Host-side arithmetic only (no Triton): triton/launch.py launches with the
config these functions choose. Every number below was timed on the H200 (V = 151936 fp32
unless named, top-p 0.95 Zipf rows, steady launches); docs/kernels.md has the tables.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Fused multiply-adds on for every kernel of the package and of the worker's model, set at
# each launch: what the kernels were checked and timed with, Triton's default up to 3.9,
# which 3.10 turns off when nothing is asked.
FP_FUSION = True
CAND_TARGET = 2048  # candidate keys per row that pass 1 keeps (at most)
KC_MIN = 16
DELTA = 12.0  # band depth below each segment max, in nats (exp(-12) = 6e-6)
NBISECT = 6  # band threshold search steps: DELTA / 64 resolution is plenty
BAND_WARPS = 8
# Pass 1: 512 lanes (2 per thread) a program. B=128 fp32 32.9 us (a plain read of the
# logits: 21.4), B=1 5.0 us with 2048-token segments (floor 2.7).
LANES = 512
# Segments of at most this many tiles are read unrolled (pass1.SHORT_TILES).
SHORT_TILES = 8
# Segments double (up to MAX_TILES tiles) while the launch keeps LANE_PROGRAMS programs or the
# row keeps ROW_SEGMENTS segments: large batches amortise each program's end-of-segment cut
# and its start over more tokens (16384 at B=128), B=1 still spreads its row over the SMs.
# A row keeps ROW_LANES lanes (19 segments) unless the launch has FULL_PROGRAMS programs:
# fewer lanes a row put three of its top tokens in one lane more often, and such a row takes
# the rescue (3 rescued rows in 512 at B=128 with 6 segments, none with 10). 512 programs
# against 1024: B=16 23.5 against 26.3 us, B=32 26.0 against 30.7, B=48 31.3 against 37.2;
# B=64 with 10 segments met a rescued row (44.5 against 34.5), so from B=54 the 19 stay.
LANE_PROGRAMS = 512
FULL_PROGRAMS = 1024
ROW_SEGMENTS = 64
ROW_LANES = 8192
# Whatever the launch size, a row keeps at least ROW_LANES_MIN lanes (or segments stop
# doubling). With |S| support tokens over L lanes a row, about C(|S|, 3) / L^2 rows put three
# in one lane: the rate depends on the lanes a row, not on V. V = 32000 at B = 512 with 1024
# lanes a row lost 6.6% of its rows to the rescue and bisection, 42x its floor.
ROW_LANES_MIN = 4096
# And a row keeps more than ROW_LANES_MIN while the launch stays under MID_PROGRAMS
# programs: V = 32000 B = 128 40.4 us with 8 segments against 32.5 with 16; V = 128256
# B = 128 84.3 against 64.5. From B = 384 the longer shape won (V = 32000 79.3 against
# 86.0, V = 128256 126.4 against 150.3). V = 151936 keeps its shape.
MID_PROGRAMS = 3072
# Segments stop at 32 tiles (16384 tokens): 64 tiles gave 5 segments a row at V = 151936
# from B = 205, and 0.39% of Zipf rows took the bisection fallback (B = 128: 137.6 us
# against 46.2). 16-bit logits take the same shape.
MAX_TILES = 32
# Pass 1's registers per thread (ptxas .maxnreg) while a thread holds at most 2 lanes: an SM
# holds 6 programs of 40 but only 4 of 64 (B=128: 32.9 us at 40, 33.5 at 64).
PASS1_REGS = 40
# Pass 1's loop reads LOOK tiles ahead of its work where a segment is longer than the
# SHORT_TILES read whole (B >= 27): twice the bytes in flight, at PASS1_REGS_LOOK registers
# (5 programs an SM). The whole sample: B = 32 25.9 -> 24.4 us, 128 46.1 -> 44.2-44.9,
# 512 135.6 -> 134.7. Two tiles at 40 registers gained half as much; three, or 48
# registers alone, less.
LOOK = 2
PASS1_REGS_LOOK = 48
# From REREAD_BATCH rows pass 1 reads a lane's column again when it let a band token go
# below fewer than REREAD_BELOW of the segment's tops (pass1.lanes_pass): three of a
# row's support in one lane otherwise send 0.24-0.29% of rows to the rescue, which holds the
# whole launch. B = 128 54.9 -> 45.1 us, 192 78.8 -> 68.7, 256 105.2 -> 80.8, 512 165.5 ->
# 145.9. Below 32 rows the branch costs about 1 us (B = 1 12.9 -> 13.8). 32 tops cost more
# (B = 256 82.5), 8 leave rows to the rescue (98.9).
REREAD_BATCH = 32
REREAD_BELOW = 16
REREAD_LANES = 8  # collided lanes a segment reads again at most (one [8, tiles] block)
# resolve_kernel compiles to 255 registers a thread (its rescue gathers four tiers of keys),
# one program an SM. From RESOLVE_REGS_BATCH rows (past one row an SM of the H200) it is
# capped at RESOLVE_REGS, two programs an SM: each row is slower, but the second program
# repays it past one wave. B = 160 58.98 -> 56.30 us, 256 80.2 -> 77.6, 512 145.1 -> 137.0,
# 1024 276.3 -> 254.9.
RESOLVE_REGS_BATCH = 133
RESOLVE_REGS = 128
RESOLVE_BISECT = 8  # halvings of the threshold search picking a tier's best (in quarters)
TIERS = (256, 1024)  # candidates sorted per row: most rows decide on the first tier
# The rescue gathers up to this many second tiers of keys above its floor, then picks the
# best second tier of them (triton/rescue.py).
RESCUE_TIERS = 4
# Rounds of the rescue at most: round r reads the r segments with the highest floors again
# (two bad segments in one row were one rescued row in five at B = 256).
RESCUE_ROUNDS = 3
FB_BLOCK = 2048  # tokens a read of the whole-row fallback takes at a time
# Largest mask a row may emit on CUDA: the fallback sorts up to this many keys in registers.
MAX_CAP = 16384


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b) (triton.cdiv is a constexpr function since triton 3.5: a few us
    of host time a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Host-side smallest power of two >= n (n >= 1), like triton.next_power_of_2."""
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class BandConfig:
    chunk: int  # tokens per pass-1 program (a segment)
    kc: int  # candidate slots per segment
    n_chunks: int
    lanes: int  # pass 1's lanes (a power of two)
    # lanes that let a band token go read their column again when fewer than this many tops
    # lie above it (0: never)
    reread: int
    regs: int  # pass 1's registers per thread (.maxnreg); 0: the compiler's
    look: int  # tiles pass 1's loop reads ahead of its work: 1-3
    resolve_regs: int  # resolve_kernel's registers per thread (.maxnreg); 0: the compiler's
    pack: bool = True  # up to one row an SM: resolve packs the CSR (no emit launch)

    @property
    def ncand(self) -> int:
        return self.n_chunks * self.kc


def band_config(
    vocab: int,
    batch: int = 1,
    *,
    chunk: int | None = None,
    kc: int | None = None,
    lanes: int | None = None,
    reread: int | bool | None = None,
    look: int | None = None,
    pack: bool = True,
) -> BandConfig:
    """The launch shape for a vocabulary and batch size. The keywords are for tests, which
    shrink the segment (chunk), its slots (kc) and lanes, turn the reread on or off, set the
    look-ahead, or keep resolve from packing the CSR (pack=False: emit_kernel packs it).

    The segment grows with the batch, so a worker meets a few configs (powers of two of
    tiles) per vocabulary; each compiles its own pass 1 once."""
    lanes = LANES if lanes is None else lanes
    if lanes <= 0:
        raise ValueError(f"lanes must be positive, got {lanes}")
    if reread is None:
        reread = REREAD_BELOW if batch >= REREAD_BATCH else 0
    elif reread is True:
        reread = REREAD_BELOW
    if chunk is None:
        lanes = min(lanes, next_pow2(vocab))
        chunk = lanes_segment(vocab, lanes, batch)
    n_chunks = cdiv(vocab, chunk)
    if kc is None:
        per_chunk = max(KC_MIN, CAND_TARGET // n_chunks)
        kc = min(chunk, 1 << (per_chunk.bit_length() - 1))  # a power of two for tl.arange
    lanes = min(lanes, chunk)
    if look is None:  # segments of at most SHORT_TILES tiles are read whole
        look = LOOK if chunk // lanes > SHORT_TILES else 1
    if look not in (1, 2, 3):
        raise ValueError(f"look must be 1, 2 or 3, got {look}")
    regs = (PASS1_REGS_LOOK if look > 1 else PASS1_REGS) if lanes <= 64 * BAND_WARPS else 0
    return BandConfig(
        chunk=chunk,
        kc=kc,
        n_chunks=n_chunks,
        lanes=lanes,
        reread=int(reread),
        regs=regs,
        look=look,
        resolve_regs=RESOLVE_REGS if batch >= RESOLVE_REGS_BATCH else 0,
        pack=pack,
    )


@functools.lru_cache(maxsize=1024)
def default_config(vocab: int, batch: int) -> BandConfig:
    """band_config(vocab, batch=batch), computed once per shape (kernels.sample's path)."""
    return band_config(vocab, batch=batch)


def lanes_segment(vocab: int, lanes: int, batch: int) -> int:
    """Tokens per pass-1 program: a power-of-two number of tiles of lanes."""
    tiles = 1
    while tiles < MAX_TILES:
        segments = cdiv(vocab, 2 * tiles * lanes)  # per row, after doubling
        if segments * lanes < ROW_LANES_MIN:
            break
        if segments * lanes <= ROW_LANES_MIN and batch * segments < MID_PROGRAMS:
            break
        if batch * segments < LANE_PROGRAMS and segments < ROW_SEGMENTS:
            break
        if segments * lanes < ROW_LANES and batch * segments < FULL_PROGRAMS:
            break
        tiles *= 2
    return tiles * lanes


def reread_constants(cfg: BandConfig) -> dict[str, int]:
    """band_lanes_kernel's reread constexprs for a config: its threshold (0: no reread), the
    collided lanes a segment reads again at most and its tiles, rounded up to a power of
    two."""
    return {
        "REREAD_BELOW": cfg.reread,
        "REREAD_LANES": REREAD_LANES,
        "REREAD_TILES": next_pow2(cdiv(cfg.chunk, cfg.lanes)),
    }


def max_chunks(vocab: int, cfg: BandConfig) -> int:
    """The most segments any batch size gives this vocabulary, so resolve_kernel's block of
    segment statistics (a compile-time size) does not change with B."""
    return cdiv(vocab, cfg.lanes)
