"""testbed.expect: a prediction beside a measurement, and the verdict between them."""

from __future__ import annotations

from testbed.expect import RING_SOURCE, Expectation, expectation_lines, ring_allreduce


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
