"""The incast's expected vs measured rows (testbed.incast_expect): no root needed."""

from __future__ import annotations

import pytest

from fabric.addressing import plan
from testbed import incast_expect as ie
from testbed.expect import Expectation
from topologies import leaf_spine, units


def test_the_on_off_cycle_averages_to_the_share_and_peaks_at_half_the_line():
    line, share, dx = 12.5e6, 12.5e6 / 7, 2085
    rate = ie.pause_rate_per_s(share, line, dx, 0)
    cycle_s = (dx / share) + dx / (line - share)
    assert rate == pytest.approx(1 / cycle_s)
    on_s = dx / (line - share)          # sending at C for on_s of each cycle: r on average
    assert line * on_s * rate == pytest.approx(share)
    assert ie.pause_rate_per_s(line / 2, line, dx, 0) == pytest.approx(line / (4 * dx))
    assert ie.pause_rate_per_s(share, line, dx, 5 * dx) == pytest.approx(rate / 6)
    assert ie.pause_rate_per_s(line, line, dx, 0) == 0.0     # never drained below XON
    # a pause longer than half the quanta is refreshed
    assert ie.xoff_frames_per_pause(share, dx, 0, pause_s=1.0) == 1
    assert ie.xoff_frames_per_pause(1000.0, 2000, 0, pause_s=1.0) == 5


def test_the_receivers_switch_and_the_ingresses_that_carry_the_incast():
    topo = leaf_spine(leaves=4, spines=4, hosts_per_leaf=4)
    ranks = topo.endpoints()
    receiver = ranks[-1]
    s = ie.receiver_switch(topo, receiver)
    ups = ie.incast_ingresses(topo, ranks[:-1], receiver)
    hosts = [h for h in topo.graph.adj[s] if h in ranks and h != receiver]
    spines = [n for n in topo.graph.adj[s] if n not in ranks]
    assert sorted(ups) == sorted(hosts + spines) and len(ups) == 7
    # senders on one leaf only: their own ports, no spine
    local = ie.incast_ingresses(topo, hosts, receiver)
    assert sorted(local) == sorted(hosts)


def _report(topo, s, ups, xoff_frames, drops=0):
    addresses = plan(topo)
    keys = [f"{s}:{addresses.port(s, u).ifname}" for u in ups]
    return {"enabled": True, "config": {"tuning": {"quanta": 65535}},
            "totals": {"drops": drops}, "headroom": {"verdict": "ok"},
            "thresholds": {k: {"xoff_bytes": 4170, "xon_bytes": 2085,
                               "headroom_bytes": 70000} for k in keys},
            "ports": {k: {"xoff_frames": xoff_frames} for k in keys}}


def test_rows_for_a_15_to_1_incast_with_pfc():
    topo = leaf_spine(leaves=4, spines=4, hosts_per_leaf=4)
    ranks = topo.endpoints()
    s = ie.receiver_switch(topo, ranks[-1])
    ups = ie.incast_ingresses(topo, ranks[:-1], ranks[-1])
    metrics = {"workload": "incast", "jct_mean_s": 2.6, "ideal_s": 2.5,
               "message_bytes": 2097152, "link_mbps": 100.0,
               "iterations": [{"jct_s": 2.6}]}
    rows = ie.expectations(topo, ranks, metrics, _report(topo, s, ups, 100, drops=3))
    by = {r.what.split(",")[0]: r for r in rows}
    assert by["incast JCT"].measured == 2.6 and by["incast JCT"].matches()
    htsim = by["incast JCT / (n S / B)"]
    assert htsim.low == pytest.approx(2478.5 / 2400) and htsim.measured == pytest.approx(1.04)
    assert not by["lossless drops"].matches() and "ok" in by["lossless drops"].verdict()
    pause = by["XOFF frames/s"]
    assert pause.measured == pytest.approx(7 * 100 / 2.6)
    share, line = units.mbps_to_bytes_per_s(100) / 7, units.mbps_to_bytes_per_s(100)
    assert pause.high == pytest.approx(7 * ie.pause_rate_per_s(share, line, 2085, 0))
    assert pause.low == pytest.approx(7 * ie.pause_rate_per_s(share, line, 2085, 70000))
    # through metrics.json and back, the verdicts are the same
    assert [Expectation.from_dict(r.to_dict()).verdict() for r in rows] == \
        [r.verdict() for r in rows]


def test_no_rows_for_other_workloads_and_no_pfc_rows_without_pfc():
    topo = leaf_spine(leaves=2, spines=2, hosts_per_leaf=2)
    ranks = topo.endpoints()
    metrics = {"workload": "incast", "jct_mean_s": 1.0, "ideal_s": 0.9,
               "message_bytes": 1000, "link_mbps": 100.0, "iterations": [{"jct_s": 1.0}]}
    assert [r.what for r in ie.expectations(topo, ranks, metrics, None)] == ["incast JCT"]
    assert ie.expectations(topo, ranks, {**metrics, "workload": "alltoall"}, None) == []
    assert ie.expectations(topo, ranks, {**metrics, "jct_mean_s": None}, None) == []


def test_an_incast_within_one_server_has_no_pause_row():
    from topologies import rail_optimized
    topo = rail_optimized()
    server = topo.graph.nodes[topo.endpoints()[0]]["server"]
    ranks = [r for r in topo.endpoints() if topo.graph.nodes[r]["server"] == server][:4]
    assert ie.incast_ingresses(topo, ranks[:-1], ranks[-1]) == []      # NVLink only
    metrics = {"workload": "incast", "jct_mean_s": 1.0, "ideal_s": 0.9,
               "message_bytes": 1000, "link_mbps": 100.0, "iterations": [{"jct_s": 1.0}]}
    rows = ie.expectations(topo, ranks, metrics, {"enabled": True, "totals": {"drops": 0}})
    assert [r.what for r in rows] == ["incast JCT", "lossless drops"]
