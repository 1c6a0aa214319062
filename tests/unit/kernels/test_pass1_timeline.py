"""bench/pass1_timeline.py's figures from a launch's program stamps (host-side only: the
stamps themselves need a CUDA device)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from bench.pass1_timeline import summarise  # noqa: E402
from maskgate.kernels.triton_path import band_config, launch_band  # noqa: E402


def launch(programs: list[tuple[int, int, bool]], ghz: float = 2.0) -> dict:
    """Stamps of programs given as (start ns, end ns, read again), at a steady clock: each
    program's loop ends 2 us before its end; one that reads again reads for 1 us of those."""
    ns0 = torch.tensor([p[0] for p in programs], dtype=torch.int64) + 10**9
    ns1 = torch.tensor([p[1] for p in programs], dtype=torch.int64) + 10**9
    again = torch.tensor([p[2] for p in programs])
    clk = (ns1 - ns0).double() * ghz
    return {
        "ns0": ns0,
        "ns1": ns1,
        "clk": clk,
        "sm": torch.zeros(len(programs), dtype=torch.int64),
        "again": again,
        "loop_clk": clk - 2000 * ghz,
        "end_clk": torch.full_like(clk, 2000 * ghz),
        "read_clk": torch.where(again, 1000 * ghz, 0.0).double(),
    }


def test_two_waves_and_a_slow_program_that_read_again() -> None:
    # 20 programs of 10 us from t = 0, 20 more starting as those end, and one of the second
    # wave that read again runs 6 us longer and ends the launch.
    first = [(0, 10_000, False)] * 20
    second = [(10_100 + 100 * i, 20_100 + 100 * i, False) for i in range(19)]
    slow = [(10_500, 26_500, True)]
    s = summarise(launch(first + second + slow))
    assert s["programs"] == 40
    assert s["span_us"] == pytest.approx(26.5)
    assert s["ghz"] == pytest.approx(2.0)
    assert s["prog_us_median"] == pytest.approx(10.0)
    assert s["prog_us_max"] == pytest.approx(16.0)
    assert s["again"] == 1 and s["again_prog_us_median"] == pytest.approx(16.0)
    assert s["loop_us_median"] == pytest.approx(8.0) and s["end_us_median"] == pytest.approx(2.0)
    assert s["again_end_us_median"] == pytest.approx(2.0)
    assert s["again_read_us_median"] == pytest.approx(1.0)
    assert s["second_wave"] == 20  # started after the first program ended (at 10 us)
    assert s["last_again"] and s["last_start_us"] == pytest.approx(10.5)
    # the 95th percentile of the 40 ends lies between the second wave's last two (21.8 and
    # 21.9 us): the slow program holds the launch 4.7 us past it
    assert s["tail_us"] == pytest.approx(26.5 - 21.805)


def test_one_wave_without_rereads() -> None:
    s = summarise(launch([(i * 10, 20_000 + i * 10, False) for i in range(8)]))
    assert s["second_wave"] == 0 and s["again"] == 0 and s["again_prog_us_median"] is None
    assert s["again_read_us_median"] is None and s["loop_us_median"] == pytest.approx(18.0)
    assert not s["last_again"]
    assert s["span_us"] == pytest.approx(20.07)


def test_stamps_of_the_wrong_shape_are_refused_before_any_launch() -> None:
    """A times tensor that does not hold every program's row would be written past its end."""
    cfg = band_config(1000, batch=2)
    x = torch.zeros(2, 1000)
    stats = [torch.empty(2, cfg.n_chunks) for _ in range(3)]
    keys = torch.empty(2, cfg.ncand, dtype=torch.int64)
    short = torch.zeros(2 * cfg.n_chunks - 1, 9, dtype=torch.int64)
    with pytest.raises(ValueError, match="times must be"):
        launch_band(x, torch.ones(2), keys, *stats, cfg, times=short)
