"""testbed.expect: a prediction beside a measurement, and the verdict between them."""

from __future__ import annotations

import pytest

from testbed.expect import (
    RING_SOURCE,
    Expectation,
    expectation_lines,
    ring_allreduce,
    ring_floor_s,
)
from traffic.workloads import ideal_time_s


def test_point_prediction_matches_within_tolerance_and_says_why_not():
    e = Expectation("JCT", "S/B", "fluid model", 1.0, 1.0, 1.09, "s")
    assert e.matches() and e.verdict() == "matches" and e.predicted() == "1"
    above = Expectation("JCT", "S/B", "fluid model", 1.0, 1.0, 1.2, "s", why_not="loss")
    assert not above.matches() and above.verdict() == "does not match (above): loss"
    below = Expectation("JCT", "S/B", "fluid model", 1.0, 1.0, 0.8, "s")
    assert below.verdict() == "does not match (below)"


def test_range_and_published_range_without_tolerance():
    e = Expectation("cost cut", "published range", "paper", 38, 77, 33, "%", tolerance=0.0,
                    why_not="a 16-endpoint fabric")
    assert e.predicted() == "38 to 77" and not e.matches()
    assert e.to_dict()["verdict"] == "does not match (below): a 16-endpoint fabric"


def test_ring_allreduce_and_the_summary_table():
    e = ring_allreduce("ring all-reduce JCT, 8 ranks", 0.5, 0.52, why_not="retransmits")
    assert (e.low, e.high, e.source, e.unit) == (0.5, 0.5, RING_SOURCE, "s")
    assert e.formula == "2(n-1)/n x S/B" and e.matches()
    lines = expectation_lines([e])
    assert "## Expected vs measured" in lines
    assert lines[-1] == (f"| ring all-reduce JCT, 8 ranks | 2(n-1)/n x S/B | {RING_SOURCE} "
                         "| 0.5 s | 0.52 s | matches |")


def test_ring_floor_adds_headers_and_store_and_forward_to_the_ideal():
    # 2 ranks, two 4096 B chunks of one packet each: per step 4096 + 58 B of headers,
    # and the frame again at the switch; 2(n-1)/n = 1 step per chunk
    rate = 100e6 / 8
    assert ring_floor_s(2, 8192, 100.0, 4096) == pytest.approx(2 * (4096 + 58 + 4154) / rate)
    assert ring_floor_s(2, 8192, 100.0, 4096, switch_hops=3) == pytest.approx(
        2 * (4096 + 58 + 3 * 4154) / rate)
    over = [ring_floor_s(n, 2 << 20, 100.0, 4096) / ideal_time_s("allreduce", n, 2 << 20, 100.0)
            for n in (8, 16, 32, 64)]
    assert [round(x, 3) for x in over] == [1.03, 1.046, 1.078, 1.141]   # smaller chunks
    assert ring_floor_s(8, 8 << 20, 100.0, 4096) / ideal_time_s(
        "allreduce", 8, 8 << 20, 100.0) < over[0]                         # larger ones
