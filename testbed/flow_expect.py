"""What queueing theory predicts for open-loop flows on one bottleneck link.

Flows arrive as a Poisson process of rate lambda at a link of B bytes/s (B = rate_bps / 8)
and carry sizes S drawn from a FlowSizes; a flow of s bytes needs T = s / B seconds of the
link, and the link's load is rho = lambda E[S] / B. Two disciplines bracket a fabric:

- FIFO (M/G/1, Pollaczek-Khinchine; Kleinrock, Queueing Systems vol. 1, 1975, sec. 5.5):
  every flow waits W = lambda E[T^2] / (2 (1 - rho)) on average, then takes its service,
  so a flow of s bytes is slowed down by 1 + W / (s / B): small flows stuck behind large
  ones suffer most.
- Processor sharing (M/G/1-PS; Kleinrock, Queueing Systems vol. 2, 1976, sec. 4.4): the
  link is shared equally by the flows present, and every size is slowed down by
  1 / (1 - rho) whatever the size distribution (insensitivity).

Flows that share a link fairly (windowed transports, round-robin queues) behave closer to
PS than to FIFO; the flow workload's summary prints both beside what it measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from topologies import units
from traffic.flow_sizes import FlowSizes

FIFO_SOURCE = "Pollaczek-Khinchine, M/G/1 FIFO (Kleinrock, Queueing Systems vol. 1, 1975)"
PS_SOURCE = "M/G/1 processor sharing (Kleinrock, Queueing Systems vol. 2, 1976)"
EXACT_BELOW_BYTES = 64   # a bucket's E[1/N] sums whole bytes below this, integrates above


def _bytes_per_s(rate_bps: float) -> float:
    if not rate_bps > 0:
        raise ValueError(f"rate {rate_bps!r} bit/s: must be > 0")
    return rate_bps / units.BITS_PER_BYTE


def _check_load(load: float) -> None:
    if not 0.0 <= load < 1.0:
        raise ValueError(f"load {load!r}: an open-loop queue is stable only for 0 <= load < 1")


def service_s(size_bytes: float, rate_bps: float) -> float:
    """T = S / B: the seconds a flow of `size_bytes` holds a link of `rate_bps` bit/s."""
    return size_bytes / _bytes_per_s(rate_bps)


def arrival_rate_per_s(load: float, rate_bps: float, sizes: FlowSizes) -> float:
    """lambda = rho B / E[S]: the flows per second that load the link to `load`."""
    return load * _bytes_per_s(rate_bps) / sizes.mean_bytes()


def pk_wait_s(load: float, rate_bps: float, sizes: FlowSizes) -> float:
    """M/G/1 FIFO mean wait before service: W = lambda E[T^2] / (2 (1 - rho)), with
    E[T^2] = E[S^2] / B^2 (Pollaczek-Khinchine). ValueError unless 0 <= load < 1."""
    _check_load(load)
    b = _bytes_per_s(rate_bps)
    lam = arrival_rate_per_s(load, rate_bps, sizes)
    return lam * sizes.second_moment() / (b * b) / (2 * (1 - load))


def fifo_slowdown(size_bytes: float, load: float, rate_bps: float, sizes: FlowSizes) -> float:
    """A flow of `size_bytes` under FIFO: (W + T) / T = 1 + W / (size / B)."""
    return 1 + pk_wait_s(load, rate_bps, sizes) / service_s(size_bytes, rate_bps)


def ps_slowdown(load: float) -> float:
    """Every flow under processor sharing: 1 / (1 - rho), whatever its size."""
    _check_load(load)
    return 1 / (1 - load)


@dataclass(frozen=True)
class BucketExpectation:
    """The sizes (low_bytes, high_bytes], the fraction of flows there and the mean
    slowdown each discipline predicts for them."""

    low_bytes: float
    high_bytes: float
    fraction: float
    fifo_slowdown: float
    ps_slowdown: float


def _inverse_floor(x: float, y: float) -> float:
    """The integral of 1 / max(1, floor(s)) ds over [x, y): whole-byte cells below
    EXACT_BELOW_BYTES, above them 1 / (s - 1/2), whose error there is below 1e-6."""
    total = 0.0
    while x < y and x < EXACT_BELOW_BYTES:
        k = math.floor(x)
        top = min(y, k + 1)
        total += (top - x) / max(k, 1)
        x = top
    if y > x:
        total += math.log((y - 0.5) / (x - 0.5))
    return total


def _bucket_mass(sizes: FlowSizes, low: float, high: float) -> tuple[float, float]:
    """(P(low < N <= high), E[1/N; low < N <= high]) for N = max(1, floor(S)), the whole
    bytes FlowSizes.sample draws, exact for the piecewise-linear CDF: a segment of
    probability p over [a, b] has density p / (b - a), and N lies in (low, high] for S in
    [floor(low) + 1, floor(high) + 1) (from 0 when low < 1)."""
    s_low = math.floor(low) + 1 if low >= 1 else 0.0
    s_high = math.floor(high) + 1
    mass = inverse = 0.0
    for (a, fa), (b, fb) in pairwise(sizes.points):
        p = fb - fa
        if p <= 0:
            continue
        if a == b:                                   # an atom at a
            n = max(1, math.floor(a))
            if low < n <= high:
                mass += p
                inverse += p / n
            continue
        x, y = max(a, s_low), min(b, s_high)
        if y > x:
            density = p / (b - a)
            mass += density * (y - x)
            inverse += density * _inverse_floor(x, y)
    return mass, inverse


def expected_buckets(sizes: FlowSizes, load: float, rate_bps: float,
                     edges: list[int] | None = None) -> list[BucketExpectation]:
    """Per size bucket (edges as FlowSizes.buckets gives them: bucket i holds
    (edge[i-1], edge[i]], 0 before the first, the largest size after the last), the FIFO
    mean slowdown averaged over the bucket's sizes by the distribution's own mass,
    1 + W B E[1/N | bucket] (N: the whole bytes a sampled flow carries), and the PS
    slowdown 1 / (1 - rho)."""
    wait_s = pk_wait_s(load, rate_bps, sizes)
    b = _bytes_per_s(rate_bps)
    ps = ps_slowdown(load)
    edges = sizes.buckets() if edges is None else list(edges)
    bounds = [0.0, *(float(e) for e in edges), float(sizes.max_bytes)]
    if any(hi <= lo for lo, hi in pairwise(bounds)):
        raise ValueError(f"bucket edges {edges}: must increase, between 0 and "
                         f"{sizes.max_bytes} bytes")
    rows: list[BucketExpectation] = []
    for low, high in pairwise(bounds):
        mass, inverse = _bucket_mass(sizes, low, high)
        fifo = 1 + wait_s * b * inverse / mass if mass > 0 else math.nan
        rows.append(BucketExpectation(low, high, mass, fifo, ps))
    return rows
