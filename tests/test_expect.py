"""testbed.expect: a prediction beside a measurement, and the verdict between them."""

from __future__ import annotations

import pytest

from testbed.expect import (
    RING_SOURCE,
    Expectation,
    expectation_lines,
    ring_allreduce,
    ring_floor_s,
    ring_path,
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


def _rail(servers: int, gpus: int, spines: int = 2):
    from topologies.builders import rail_optimized
    return rail_optimized(servers, gpus, spines)


def test_a_rings_store_and_forward_follows_the_fabrics_own_routes():
    """In listed order the hop between servers goes s0g3 -> s1g0: rail 3's leaf, a
    spine, rail 0's leaf; the leaves' uplinks are faster (non-blocking), so the spine
    hops cost less than a frame each. In NCCL's rail order it is one leaf."""
    from testbed.experiment import from_toml
    from testbed.run import pick_ranks
    topo = _rail(2, 4)
    listed = topo.endpoints()
    rate, frames = ring_path(topo, listed)
    up = topo.graph.edges["leaf3", "spine0"]["rate_mbps"]
    assert rate == 100.0 and frames == pytest.approx(1 + 2 * 100.0 / up) and frames > 1
    exp = from_toml(None, {"workload": "allreduce", "ring_order": "rails",
                           "topology": {"kind": "rail_optimized", "params": {
                               "servers": 2, "gpus_per_server": 4, "spines": 2}}})
    rails = pick_ranks(exp, exp.resolve_topology())
    assert rails == ["s0g0", "s0g1", "s0g2", "s0g3", "s1g3", "s1g2", "s1g1", "s1g0"]
    assert ring_path(topo, rails) == (100.0, 1.0)
    assert sorted(rails) == sorted(listed)
    # not a ring: the order is left as listed
    exp.workload = "incast"
    assert pick_ranks(exp, exp.resolve_topology()) == listed


def test_rail_order_needs_gpus_on_rails():
    from testbed.experiment import from_toml
    from topologies.spec import SpecError
    exp = from_toml(None, {"ring_order": "rails", "topology": {
        "kind": "one_tier", "params": {"nodes": 4}}})
    with pytest.raises(SpecError) as err:
        exp.check_against(exp.resolve_topology())
    assert err.value.field == "experiment.ring_order"
