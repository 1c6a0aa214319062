"""Pass-1 shapes chosen by band_config: valid for every vocabulary, batch size and dtype the
sampler meets, and few enough per vocabulary that a worker can compile them all at start."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("triton")  # the worker extra installs it; a gateway-only checkout has none

from maskgate.kernels.triton_path import (
    CAND_TARGET,
    LANE_PROGRAMS,
    LONG_ROW_LANES,
    LONG_TILES,
    LOOK,
    MAX_TILES,
    MID_PROGRAMS,
    PASS1_REGS,
    PASS1_REGS_LOOK,
    REREAD_BATCH,
    REREAD_BELOW,
    REREAD_BELOW_LONG,
    REREAD_LANES,
    RESOLVE_REGS,
    RESOLVE_REGS_BATCH,
    ROW_LANES_MIN,
    band_config,
    cdiv,
    compile_key,
    default_config,
    help_programs,
    max_chunks,
    next_pow2,
    reread_constants,
    shared_level,
    use_shared_reads,
)

VOCABS = [111, 1000, 32000, 128256, 151936, 262144]


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def is_long(cfg) -> bool:
    """A segment past MAX_TILES tiles (session 22's long shape, with the reread on)."""
    return cfg.chunk // cfg.lanes > MAX_TILES


@pytest.mark.parametrize("vocab", VOCABS)
def test_default_shapes_are_valid_for_every_batch(vocab: int) -> None:
    shapes = set()
    for batch in range(1, 1025):
        cfg = band_config(vocab, batch=batch)
        assert cfg.lanes > 0 and is_pow2(cfg.lanes)  # tl.arange sizes
        assert cfg.chunk % cfg.lanes == 0 and cfg.chunk // cfg.lanes <= MAX_TILES
        assert not is_long(cfg)  # long segments only on request
        assert cfg.n_chunks * cfg.chunk >= vocab > (cfg.n_chunks - 1) * cfg.chunk
        assert is_pow2(cfg.kc) and cfg.kc <= cfg.chunk
        assert cfg.ncand <= 2 * CAND_TARGET  # resolve_kernel loads them in one block
        assert cfg.n_chunks <= max_chunks(vocab, cfg)  # resolve's stats block fits
        shapes.add((cfg.chunk, cfg.kc))
    assert len(shapes) <= 8  # one pass-1 compile each


@pytest.mark.parametrize(
    ("vocab", "lanes_per_row"),
    [(151936, 5120), (262144, 8192), (128256, 4096), (32000, ROW_LANES_MIN)],
)
def test_large_batches_keep_the_lanes_per_row(vocab: int, lanes_per_row: int) -> None:
    """A lane keeps two tokens, so fewer lanes per row put three of a row's support in one
    lane more often (a lost row: the rescue or the bisection). Longer segments stop at the
    B = 128 shape for V = 151936; V = 32000 stops at ROW_LANES_MIN (it had 1024 lanes a row
    at B = 512 and lost 6.6% of its rows). Fewer (LONG_ROW_LANES) only on request, with the
    collided lanes read again at REREAD_BELOW_LONG."""
    for batch in (128, 256, 512, 1024):
        cfg = band_config(vocab, batch=batch)
        assert cfg.n_chunks * cfg.lanes >= lanes_per_row, (batch, cfg)
        long = band_config(vocab, batch=batch, long_segments=True)
        assert long.n_chunks * long.lanes >= min(lanes_per_row, LONG_ROW_LANES), (batch, long)
        assert long.n_chunks * long.lanes >= ROW_LANES_MIN or long.reread == REREAD_BELOW_LONG


@pytest.mark.parametrize("vocab", VOCABS)
def test_long_segments_only_with_the_reread(vocab: int) -> None:
    """On request, a segment doubles past MAX_TILES only from REREAD_BATCH rows, once, where
    the row keeps LONG_ROW_LANES lanes and the launch LANE_PROGRAMS programs; such a launch
    reads collided lanes again below REREAD_BELOW_LONG tops and starts pass 1 without its PDL
    wait. Every other launch keeps the shape and the wait it had."""
    for batch in range(1, 1025):
        cfg = band_config(vocab, batch=batch, long_segments=True)
        if not is_long(cfg):
            assert cfg.band_wait and cfg.reread in (0, REREAD_BELOW), (batch, cfg)
            continue
        assert batch >= REREAD_BATCH and cfg.chunk // cfg.lanes == LONG_TILES, (batch, cfg)
        assert cfg.n_chunks * cfg.lanes >= LONG_ROW_LANES, (batch, cfg)
        assert batch * cfg.n_chunks >= LANE_PROGRAMS, (batch, cfg)
        assert cfg.reread == REREAD_BELOW_LONG and not cfg.band_wait, (batch, cfg)
        short = band_config(vocab, batch=batch, long_segments=False)
        assert short.chunk * 2 == cfg.chunk and short.band_wait, (batch, short)


def test_long_segments_where_they_were_timed() -> None:
    """On request V = 151936 takes 5 segments a row from 103 rows (the target case B = 128
    among them) and 262144 8 from 64; 32000 and 128256 never reach MAX_TILES with their
    lanes. Without the reread, or by default, the shape is the one the rule gives."""

    def long(vocab: int, batch: int, **kw: object) -> int:
        return band_config(vocab, batch=batch, long_segments=True, **kw).n_chunks

    assert [long(151936, b) for b in (102, 103, 128, 512)] == [19, 5, 5, 5]
    assert [long(262144, b) for b in (32, 63, 64, 512)] == [16, 16, 8, 8]
    for vocab, batch in itertools.product((32000, 128256), (128, 512, 1024)):
        assert not is_long(band_config(vocab, batch=batch, long_segments=True))
    assert long(151936, 128, reread=16) == 5  # an explicit threshold keeps the long step
    assert long(151936, 128, reread=0) == 10  # without the reread, no long step
    assert band_config(151936, batch=128).n_chunks == 10
    assert band_config(151936, batch=128, long_segments=True, band_wait=True).band_wait


@pytest.mark.parametrize("vocab", VOCABS)
def test_rows_keep_more_than_the_lane_floor_below_mid_sized_launches(vocab: int) -> None:
    """A launch of fewer than MID_PROGRAMS programs keeps more than ROW_LANES_MIN lanes a row
    wherever its segments could have: at V = 32000 and 128256 that is 16 segments a row
    from B = 128 to 383 instead of 8 (one rescued row holds a whole resolve wave); from
    B = 384 the 8 segments were faster on the H200."""
    for batch in range(1, 1025):
        cfg = band_config(vocab, batch=batch)
        if cfg.chunk > cfg.lanes and batch * cfg.n_chunks < MID_PROGRAMS and not is_long(cfg):
            assert cfg.n_chunks * cfg.lanes > ROW_LANES_MIN, (batch, cfg)
    if vocab in (32000, 128256):
        shapes = [band_config(vocab, batch=b).n_chunks for b in (128, 256, 383, 384, 512)]
        assert shapes == [16, 16, 16, 8, 8]
    if vocab == 151936:
        assert band_config(vocab, batch=128).n_chunks == 10  # the target case keeps its shape


@pytest.mark.parametrize("vocab", VOCABS)
def test_segments_never_double_below_the_row_lane_floor(vocab: int) -> None:
    """Segments double only while the row keeps ROW_LANES_MIN lanes: a segment of more than
    one tile leaves the row at least that many (the long step aside)."""
    for batch in (1, 8, 64, 512, 1024):
        cfg = band_config(vocab, batch=batch)
        if cfg.chunk > cfg.lanes and not is_long(cfg):
            assert cfg.n_chunks * cfg.lanes >= ROW_LANES_MIN, (batch, cfg)


def test_longer_segments_for_larger_batches() -> None:
    one, many = (band_config(151936, batch=b).chunk for b in (1, 128))
    assert one < many


def test_one_launch_only_on_request() -> None:
    """The fused launch (band_resolve_kernel) lost to the two launches with PDL at every
    batch size timed on the H200, so it is never the default."""
    for batch in (1, 2, 3, 128):
        assert not band_config(151936, batch=batch).fused
    assert band_config(151936, batch=1, fused=True).fused
    assert not band_config(151936, lanes=0).fused  # band_kernel is never fused
    with pytest.raises(ValueError, match="lanes"):
        band_config(151936, lanes=0, fused=True)


def test_loop_reads_ahead_where_segments_are_longer_than_the_unrolled_ones() -> None:
    """Pass 1 reads LOOK tiles ahead at PASS1_REGS_LOOK registers where its segment is a loop
    (more than SHORT_TILES tiles: B >= 27 at V = 151936), one tile at PASS1_REGS where it is
    read whole; band_kernel and the fused launch read one."""
    assert (LOOK, PASS1_REGS_LOOK, PASS1_REGS) == (2, 48, 40)
    for batch in (1, 16, 26):
        cfg = band_config(151936, batch=batch)
        assert cfg.chunk // cfg.lanes <= 8 and (cfg.look, cfg.regs) == (1, PASS1_REGS)
    for vocab, batch in itertools.product(VOCABS, (27, 128, 512)):
        cfg = band_config(vocab, batch=batch)
        long_loop = cfg.chunk // cfg.lanes > 8
        assert (cfg.look, cfg.regs) == ((LOOK, PASS1_REGS_LOOK) if long_loop else (1, PASS1_REGS))
    assert band_config(151936, batch=128, look=1).regs == PASS1_REGS
    assert band_config(151936, batch=128, look=3, regs=56).regs == 56
    assert band_config(151936, batch=128, fused=True).look == 1
    assert band_config(151936, batch=128, lanes=0).look == 1
    for bad in ({"look": 4}, {"look": 2, "fused": True}, {"look": 2, "lanes": 0}):
        with pytest.raises(ValueError, match="look"):
            band_config(151936, batch=128, **bad)


def test_lanes_keep_two_or_three_tokens() -> None:
    assert band_config(151936, batch=128).keep == 2
    assert band_config(151936, batch=128, keep=3).keep == 3
    with pytest.raises(ValueError, match="keep"):
        band_config(151936, keep=4)


def test_collided_lanes_read_again_from_32_rows() -> None:
    """Pass 1's reread is on from REREAD_BATCH rows (where launches meet rescued rows often
    enough to pay for it) and off below, and only with two-token lanes of the split launch."""
    assert REREAD_BATCH == 32
    assert [band_config(151936, batch=b).reread for b in (1, 16, REREAD_BATCH - 1)] == [0, 0, 0]
    for batch in (REREAD_BATCH, 128, 255):
        assert band_config(151936, batch=batch).reread == REREAD_BELOW
    for batch in (103, 128, 255):  # long segments, on request
        assert band_config(151936, batch=batch, long_segments=True).reread == REREAD_BELOW_LONG
    assert band_config(32000, batch=512).reread == REREAD_BELOW
    assert band_config(151936, batch=512, keep=3).reread == 0
    assert band_config(151936, batch=512, lanes=0).reread == 0
    assert band_config(151936, batch=1, reread=True).reread == REREAD_BELOW
    assert band_config(151936, batch=512, reread=32).reread == 32
    assert band_config(151936, batch=512, reread=False).reread == 0
    for bad in ({"keep": 3}, {"lanes": 0}, {"fused": True}):
        with pytest.raises(ValueError, match="reread"):
            band_config(151936, batch=1, reread=True, **bad)


def test_resolve_capped_at_two_programs_an_sm_from_large_batches() -> None:
    """resolve_kernel's registers are capped from RESOLVE_REGS_BATCH rows (past one wave of
    the H200's SMs, with the reread on), left to the compiler below, and set as asked."""
    assert RESOLVE_REGS_BATCH == 133  # one row an SM of the H200 keeps the compiler's count
    assert [band_config(151936, batch=b).resolve_regs for b in (1, 128, 132)] == [0, 0, 0]
    for vocab, batch in itertools.product(VOCABS, (RESOLVE_REGS_BATCH, 512, 4096)):
        assert band_config(vocab, batch=batch).resolve_regs == RESOLVE_REGS
    assert band_config(151936, batch=512, resolve_regs=0).resolve_regs == 0
    assert band_config(151936, batch=1, resolve_regs=96).resolve_regs == 96
    assert band_config(151936, batch=512, fused=True).resolve_regs == 0


def test_reread_block_covers_the_segment() -> None:
    """The reread's lane block: a power of two of lanes (tl.arange) and of tiles, which
    cover the segment; its threshold is the config's, 0 where it is off."""
    for vocab, batch in itertools.product((1000, 32000, 151936, 262144), (1, 128, 256, 4096)):
        cfg = band_config(vocab, batch=batch, reread=True)
        c = reread_constants(cfg)
        assert c["REREAD_BELOW"] == REREAD_BELOW
        assert c["REREAD_LANES"] == REREAD_LANES and is_pow2(REREAD_LANES)
        tiles = c["REREAD_TILES"]
        assert is_pow2(tiles) and tiles * cfg.lanes >= cfg.chunk
    assert reread_constants(band_config(151936, batch=1))["REREAD_BELOW"] == 0
    long = reread_constants(band_config(151936, batch=128, long_segments=True))
    assert long["REREAD_BELOW"] == REREAD_BELOW_LONG and long["REREAD_TILES"] == LONG_TILES


def test_host_helpers_match_triton() -> None:
    import triton

    for n in [1, 2, 3, 15, 16, 17, 111, 1000, 4095, 4096, 32000, 151936, 262144]:
        assert next_pow2(n) == triton.next_power_of_2(n)
        for d in (1, 2, 512, 2048, 16384):
            assert cdiv(n, d) == triton.cdiv(n, d)


def test_default_config_is_band_config_once_per_shape() -> None:
    for vocab, batch in ((151936, 1), (151936, 128), (32000, 512), (111, 3)):
        assert default_config(vocab, batch) == band_config(vocab, batch=batch)
    assert default_config(151936, 128) is default_config(151936, 128)


def test_shared_reads_and_helper_programs_only_on_request() -> None:
    """Shared reads are off by default; on, the listing read is shared too unless
    shared_lists is off (resolve's SHARED 2 or 1). Helper programs need shared reads, come
    only on the pack path (sm_count a wave; two under the interpreter) and never with the
    fused launch, which has no pack path."""
    import torch

    cpu = torch.device("cpu")
    cfg = band_config(49152, batch=128)
    assert not cfg.shared_reads and shared_level(cfg) == 0 and help_programs(cfg, 2, cpu) == 0
    shared = band_config(49152, batch=128, shared_reads=True, help_waves=2)
    assert shared_level(shared) == 2
    assert help_programs(shared, 2, cpu) == 4
    assert help_programs(shared, 0, cpu) == help_programs(shared, 1, cpu) == 0
    counts = band_config(49152, batch=128, shared_reads=True, shared_lists=False)
    assert shared_level(counts) == 1 and counts.help_waves == 0
    fused = band_config(49152, batch=128, fused=True, shared_reads=True, help_waves=1)
    assert not fused.shared_reads and fused.help_waves == 0 and shared_level(fused) == 0
    for bad in ({"help_waves": 1}, {"shared_reads": True, "help_waves": -1}):
        with pytest.raises(ValueError, match="help_waves"):
            band_config(49152, batch=128, **bad)


def test_use_shared_reads_sets_kernels_sample_default_and_its_compile_keys() -> None:
    """use_shared_reads (the worker's mask_shared_reads) switches kernels.sample's default
    config process-wide; with it on, the batch sizes that may pack (2 to one row an SM:
    every B > 1 under the interpreter) compile resolve apart (HELP), which compile_key
    tells the worker's warm-up. Off, one key per config, as before."""
    import torch

    cpu = torch.device("cpu")
    assert not default_config(49152, 64).shared_reads
    assert compile_key(49152, 1, cpu) == (default_config(49152, 1), False)
    assert compile_key(49152, 64, cpu) == (default_config(49152, 64), False)
    try:
        use_shared_reads(True)
        cfg = default_config(49152, 64)
        assert cfg == band_config(49152, batch=64, shared_reads=True) and shared_level(cfg) == 2
        assert compile_key(49152, 1, cpu) == (default_config(49152, 1), False)
        assert compile_key(49152, 2, cpu)[1] and compile_key(49152, 64, cpu) == (cfg, True)
    finally:
        use_shared_reads(False)
    assert default_config(49152, 64) == band_config(49152, batch=64)
