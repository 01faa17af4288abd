"""Queueing predictions for open-loop flows: Pollaczek-Khinchine's FIFO wait against
M/D/1 and M/M/1 known answers and a simulated queue, processor sharing's 1 / (1 - rho),
and the per-bucket slowdowns against sizes drawn by the sampler."""

from __future__ import annotations

import math
import random
from itertools import pairwise

import pytest

from testbed import flow_expect as fe
from traffic.flow_sizes import FlowSizes, load

RATE_BPS = 8e9            # B = 1e9 bytes/s: a size in bytes is its service time in ns


def atoms(*pairs: tuple[float, float]) -> FlowSizes:
    """Sizes (bytes, probability) as a CDF of atoms."""
    points, total = [], 0.0
    for size, p in pairs:
        points += [(size, total), (size, total + p)]
        total += p
    return FlowSizes("atoms", tuple(points), "test")


def test_service_and_arrival_rate():
    d = atoms((1000, 1.0))
    assert fe.service_s(1000, RATE_BPS) == pytest.approx(1e-6)
    # 0.5 x 1e9 B/s / 1000 B = 500,000 flows per second
    assert fe.arrival_rate_per_s(0.5, RATE_BPS, d) == pytest.approx(5e5)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
def test_md1_known_answer(rho):
    # all sizes equal: W = rho T / (2 (1 - rho))
    d = atoms((1500, 1.0))
    t = 1500 / 1e9
    assert fe.pk_wait_s(rho, RATE_BPS, d) == pytest.approx(rho * t / (2 * (1 - rho)))
    assert fe.fifo_slowdown(1500, rho, RATE_BPS, d) == pytest.approx(1 + rho / (2 * (1 - rho)))


def test_two_point_known_answer():
    # 1000 B or 3000 B, half each: E[S] = 2000, E[S^2] = 0.5 (1e6 + 9e6) = 5e6 B^2;
    # rho 0.5: lambda = 0.5e9 / 2000 = 250,000 /s, E[T^2] = 5e-12 s^2,
    # W = 250,000 x 5e-12 / (2 x 0.5) = 1.25 us
    d = atoms((1000, 0.5), (3000, 0.5))
    assert fe.pk_wait_s(0.5, RATE_BPS, d) == pytest.approx(1.25e-6)
    assert fe.fifo_slowdown(1000, 0.5, RATE_BPS, d) == pytest.approx(2.25)
    assert fe.fifo_slowdown(3000, 0.5, RATE_BPS, d) == pytest.approx(1 + 1.25 / 3)


def test_mm1_like_with_an_exponential_cdf():
    """Exponential sizes of mean m (a fine piecewise-linear CDF up to 30 m): E[S^2] = 2 m^2,
    so W = rho (m / B) / (1 - rho), M/M/1's wait in queue."""
    m = 10_000.0
    step = m / 100
    points = [(k * step, 1 - math.exp(-k * step / m)) for k in range(3000)]
    points.append((3000 * step, 1.0))
    d = FlowSizes("exp", tuple(points), "test")
    assert d.mean_bytes() == pytest.approx(m, rel=1e-3)
    for rho in (0.3, 0.7):
        assert fe.pk_wait_s(rho, RATE_BPS, d) == pytest.approx(rho * (m / 1e9) / (1 - rho),
                                                               rel=2e-3)


def test_pk_wait_matches_a_simulated_fifo_queue():
    """Lindley's recursion W' = max(0, W + T - A) over 200,000 flows of uniform sizes
    [1000, 3000] B at rho 0.5 gives the P-K mean wait within 5 % (seeded)."""
    d = FlowSizes("u", ((1000.0, 0.0), (3000.0, 1.0)), "test")
    rho = 0.5
    lam = fe.arrival_rate_per_s(rho, RATE_BPS, d)
    rng = random.Random(11)
    wait = total = 0.0
    n = 200_000
    for _ in range(n):
        total += wait
        wait = max(0.0, wait + fe.service_s(d.sample(rng), RATE_BPS) - rng.expovariate(lam))
    expected = fe.pk_wait_s(rho, RATE_BPS, d)
    assert expected == pytest.approx(2.5e5 * (13e6 / 3) / 1e18)      # hand: 1.083 us
    assert total / n == pytest.approx(expected, rel=0.05)


def test_ps_slowdown():
    assert fe.ps_slowdown(0.5) == 2
    assert fe.ps_slowdown(0.0) == 1
    assert fe.ps_slowdown(0.9) == pytest.approx(10)


@pytest.mark.parametrize("load_", [1.0, 1.2, -0.1, math.nan])
def test_load_at_or_above_one_is_refused(load_):
    d = atoms((1000, 1.0))
    for call in (lambda: fe.pk_wait_s(load_, RATE_BPS, d),
                 lambda: fe.fifo_slowdown(1000, load_, RATE_BPS, d),
                 lambda: fe.ps_slowdown(load_),
                 lambda: fe.expected_buckets(d, load_, RATE_BPS)):
        with pytest.raises(ValueError, match="load"):
            call()
    with pytest.raises(ValueError, match="rate"):
        fe.pk_wait_s(0.5, 0, d)


@pytest.mark.parametrize("name", ["websearch", "fb_hadoop", "ali_storage", "google_rpc"])
def test_buckets_fifo_falls_with_size_and_ps_is_flat(name):
    d = load(name)
    rows = fe.expected_buckets(d, 0.5, 100e9)
    assert len(rows) == len(d.buckets()) + 1
    assert sum(r.fraction for r in rows) == pytest.approx(1.0)
    assert all(r.fraction > 0 for r in rows)
    fifo = [r.fifo_slowdown for r in rows]
    assert all(a > b for a, b in pairwise(fifo))
    assert fifo[-1] > 1
    assert all(r.ps_slowdown == 2 for r in rows)
    assert rows[0].low_bytes == 0 and rows[-1].high_bytes == d.max_bytes


class GridRandom(random.Random):
    """random() walks the midpoints of n equal cells of [0, 1): sampling without noise."""

    def __init__(self, n: int):
        super().__init__(0)
        self.n, self.i = n, 0

    def random(self) -> float:
        self.i += 1
        return (self.i - 0.5) / self.n


@pytest.mark.parametrize("name", ["websearch", "google_rpc"])
def test_bucket_slowdown_is_the_mean_over_sampled_sizes(name):
    """Each bucket's FIFO slowdown is the mean of 1 + W B / N over the sizes N that
    sample() draws into it (u on an even grid of 400,000 points), within 0.5 %."""
    d = load(name)
    rate_bps, rho = 100e9, 0.5
    wb = fe.pk_wait_s(rho, rate_bps, d) * rate_bps / 8
    n = 400_000
    grid = GridRandom(n)
    drawn = [d.sample(grid) for _ in range(n)]
    for row in fe.expected_buckets(d, rho, rate_bps):
        inside = [s for s in drawn if row.low_bytes < s <= row.high_bytes]
        assert len(inside) / n == pytest.approx(row.fraction, abs=1e-3)
        mean = sum(1 + wb / s for s in inside) / len(inside)
        assert mean == pytest.approx(row.fifo_slowdown, rel=5e-3)


def test_bucket_of_tiny_flows_counts_whole_bytes():
    # uniform on [0, 3] B: sample() gives 1 for [0, 2) and 2 for [2, 3), so
    # E[1/N] = (2/3) x 1 + (1/3) x 1/2 = 5/6
    d = FlowSizes("tiny", ((0.0, 0.0), (3.0, 1.0)), "test")
    (row,) = fe.expected_buckets(d, 0.5, RATE_BPS, edges=[])
    wb = fe.pk_wait_s(0.5, RATE_BPS, d) * 1e9
    assert row.fraction == pytest.approx(1.0)
    assert row.fifo_slowdown == pytest.approx(1 + wb * 5 / 6)


def test_bad_edges_are_refused():
    d = load("websearch")
    with pytest.raises(ValueError, match="edges"):
        fe.expected_buckets(d, 0.5, RATE_BPS, edges=[5000, 1000])
