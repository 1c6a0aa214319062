"""Pass-1 shapes chosen by band_config: valid for every vocabulary, batch size and dtype the
sampler meets, and few enough per vocabulary that a worker can compile them all at start."""

from __future__ import annotations

import itertools

import pytest

from maskgate.kernels.triton.config import (
    CAND_TARGET,
    LOOK,
    MAX_TILES,
    MID_PROGRAMS,
    PASS1_REGS,
    PASS1_REGS_LOOK,
    REREAD_BATCH,
    REREAD_BELOW,
    REREAD_LANES,
    RESOLVE_REGS,
    RESOLVE_REGS_BATCH,
    ROW_LANES_MIN,
    band_config,
    cdiv,
    default_config,
    max_chunks,
    next_pow2,
    reread_constants,
)

VOCABS = [111, 1000, 32000, 128256, 151936, 262144]


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize("vocab", VOCABS)
def test_default_shapes_are_valid_for_every_batch(vocab: int) -> None:
    shapes = set()
    for batch in range(1, 1025):
        cfg = band_config(vocab, batch=batch)
        assert cfg.lanes > 0 and is_pow2(cfg.lanes)  # tl.arange sizes
        assert cfg.chunk % cfg.lanes == 0 and cfg.chunk // cfg.lanes <= MAX_TILES
        assert cfg.n_chunks * cfg.chunk >= vocab > (cfg.n_chunks - 1) * cfg.chunk
        assert is_pow2(cfg.kc) and cfg.kc <= cfg.chunk
        assert cfg.ncand <= 2 * CAND_TARGET  # resolve_kernel loads them in one block
        assert cfg.n_chunks <= max_chunks(vocab, cfg)  # resolve's stats block fits
        shapes.add((cfg.chunk, cfg.kc))
    assert len(shapes) <= 8  # one pass-1 compile each


@pytest.mark.parametrize("vocab", VOCABS)
def test_rows_keep_more_than_the_lane_floor_below_mid_sized_launches(vocab: int) -> None:
    """A launch of fewer than MID_PROGRAMS programs keeps more than ROW_LANES_MIN lanes a row
    wherever its segments could have: at V = 32000 and 128256 that is 16 segments a row
    from B = 128 to 383 instead of 8 (one rescued row holds a whole resolve wave); from
    B = 384 the 8 segments were faster on the H200."""
    for batch in range(1, 1025):
        cfg = band_config(vocab, batch=batch)
        if cfg.chunk > cfg.lanes and batch * cfg.n_chunks < MID_PROGRAMS:
            assert cfg.n_chunks * cfg.lanes > ROW_LANES_MIN, (batch, cfg)
    if vocab in (32000, 128256):
        shapes = [band_config(vocab, batch=b).n_chunks for b in (128, 256, 383, 384, 512)]
        assert shapes == [16, 16, 16, 8, 8]
    if vocab == 151936:
        assert band_config(vocab, batch=128).n_chunks == 10  # the target case keeps its shape


@pytest.mark.parametrize("vocab", VOCABS)
def test_segments_never_double_below_the_row_lane_floor(vocab: int) -> None:
    """Segments double only while the row keeps ROW_LANES_MIN lanes: a segment of more than
    one tile leaves the row at least that many."""
    for batch in (1, 8, 64, 512, 1024):
        cfg = band_config(vocab, batch=batch)
        if cfg.chunk > cfg.lanes:
            assert cfg.n_chunks * cfg.lanes >= ROW_LANES_MIN, (batch, cfg)


def test_longer_segments_for_larger_batches() -> None:
    one, many = (band_config(151936, batch=b).chunk for b in (1, 128))
    assert one < many


def test_loop_reads_ahead_where_segments_are_longer_than_the_unrolled_ones() -> None:
    """Pass 1 reads LOOK tiles ahead at PASS1_REGS_LOOK registers where its segment is a loop
    (more than SHORT_TILES tiles: B >= 27 at V = 151936), one tile at PASS1_REGS where it is
    read whole."""
    assert (LOOK, PASS1_REGS_LOOK, PASS1_REGS) == (2, 48, 40)
    for batch in (1, 16, 26):
        cfg = band_config(151936, batch=batch)
        assert cfg.chunk // cfg.lanes <= 8 and (cfg.look, cfg.regs) == (1, PASS1_REGS)
    for vocab, batch in itertools.product(VOCABS, (27, 128, 512)):
        cfg = band_config(vocab, batch=batch)
        long_loop = cfg.chunk // cfg.lanes > 8
        assert (cfg.look, cfg.regs) == ((LOOK, PASS1_REGS_LOOK) if long_loop else (1, PASS1_REGS))
    assert band_config(151936, batch=128, look=1).regs == PASS1_REGS
    assert band_config(151936, batch=128, look=3).regs == PASS1_REGS_LOOK
    with pytest.raises(ValueError, match="look"):
        band_config(151936, batch=128, look=4)
    with pytest.raises(ValueError, match="lanes"):
        band_config(151936, batch=128, lanes=0)


def test_collided_lanes_read_again_from_32_rows() -> None:
    """Pass 1's reread is on from REREAD_BATCH rows (where launches meet rescued rows often
    enough to pay for it) and off below, unless a test asks."""
    assert REREAD_BATCH == 32
    assert [band_config(151936, batch=b).reread for b in (1, 16, REREAD_BATCH - 1)] == [0, 0, 0]
    for batch in (REREAD_BATCH, 128, 255):
        assert band_config(151936, batch=batch).reread == REREAD_BELOW
    assert band_config(32000, batch=512).reread == REREAD_BELOW
    assert band_config(151936, batch=1, reread=True).reread == REREAD_BELOW
    assert band_config(151936, batch=512, reread=32).reread == 32
    assert band_config(151936, batch=512, reread=False).reread == 0


def test_resolve_capped_at_two_programs_an_sm_from_large_batches() -> None:
    """resolve_kernel's registers are capped from RESOLVE_REGS_BATCH rows (past one wave of
    the H200's SMs, with the reread on), left to the compiler below."""
    assert RESOLVE_REGS_BATCH == 133  # one row an SM of the H200 keeps the compiler's count
    assert [band_config(151936, batch=b).resolve_regs for b in (1, 128, 132)] == [0, 0, 0]
    for vocab, batch in itertools.product(VOCABS, (RESOLVE_REGS_BATCH, 512, 4096)):
        assert band_config(vocab, batch=batch).resolve_regs == RESOLVE_REGS


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


def test_host_helpers_match_triton() -> None:
    triton = pytest.importorskip("triton")

    for n in [1, 2, 3, 15, 16, 17, 111, 1000, 4095, 4096, 32000, 151936, 262144]:
        assert next_pow2(n) == triton.next_power_of_2(n)
        for d in (1, 2, 512, 2048, 16384):
            assert cdiv(n, d) == triton.cdiv(n, d)


def test_default_config_is_band_config_once_per_shape() -> None:
    for vocab, batch in ((151936, 1), (151936, 128), (32000, 512), (111, 3)):
        assert default_config(vocab, batch) == band_config(vocab, batch=batch)
    assert default_config(151936, 128) is default_config(151936, 128)


@pytest.mark.parametrize(
    ("vocab", "lanes_per_row"),
    [(151936, 5120), (262144, 8192), (128256, 4096), (32000, ROW_LANES_MIN)],
)
def test_large_batches_keep_the_lanes_per_row(vocab: int, lanes_per_row: int) -> None:
    """A lane keeps two tokens, so fewer lanes per row put three of a row's support in one
    lane more often (a lost row: the rescue or the bisection). Longer segments stop at the
    B = 128 shape for V = 151936; V = 32000 stops at ROW_LANES_MIN."""
    for batch in (128, 256, 512, 1024):
        cfg = band_config(vocab, batch=batch)
        assert cfg.n_chunks * cfg.lanes >= lanes_per_row, (batch, cfg)
