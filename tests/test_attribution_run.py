"""Each flow's path as the kernel gives it, and a run whose flows.csv splits every flow."""

from __future__ import annotations

import csv
import time

import pytest

from fabric.paths import PathFinder
from testbed.experiment import from_toml
from testbed.run import run
from topologies import leaf_spine

from .conftest import link_counters, udp_socket_in

pytestmark = pytest.mark.root


def _spine_rx(fab, topo, leaf: str) -> dict[str, int]:
    """Packets each spine received from `leaf` (the ICMP errors coming back do not
    count: they arrive from the other leaf)."""
    return {s: link_counters(fab, s)[topo.ifname(s, leaf)]["rx_packets"]
            for s in topo.graph if topo.role(s) == "spine"}


def test_the_kernels_path_for_a_source_port_is_the_one_its_frames_take(fabric):
    topo = leaf_spine(leaves=2, spines=4, hosts_per_leaf=1)
    fab = fabric(topo)
    src, dst = topo.endpoints()
    finder = PathFinder(fab, topo)
    try:
        chosen = set()
        for sport in range(49152, 49152 + 16):
            path = finder.path(src, dst, topo.ports(src)[0], sport)
            assert path[0] == src and path[-1] == dst and len(path) == 5
            chosen.add(path[2])
            before = _spine_rx(fab, topo, path[1])
            sock = udp_socket_in(fab, src)
            sock.bind((finder.loopback[src], sport))
            for _ in range(40):
                sock.sendto(b"x" * 200, (finder.loopback[dst], 4791))
            sock.close()
            time.sleep(0.1)
            after = _spine_rx(fab, topo, path[1])
            rose = {s for s in after if after[s] - before[s] >= 40}
            assert rose == {path[2]}, (sport, path, rose)
        assert len(chosen) > 1          # the hash spreads source ports over the spines
    finally:
        finder.close()


def test_a_run_splits_each_flows_time_at_its_share_of_the_link_it_shares(tmp_path,
                                                                        host_untouched):
    """Three flows from one leaf cross its single uplink, as fast as one host link: each
    one's fair share is a third of it while all three run."""
    exp = from_toml(None, {
        "name": "t_split", "workload": "p2p", "message_bytes": 512 * 1024, "iterations": 2,
        "pairs": ["l0h0>l1h0", "l0h1>l1h1", "l0h2>l1h2"], "pfc": "on", "transport": "roce",
        "results_dir": str(tmp_path), "timeout_s": 120.0, "rto_ms": 200.0,
        "topology": {"kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 3, "rate_mbps": 20.0,
            "uplink_rate_mbps": 20.0}}})
    folder, m = run(exp)
    assert m["flows"]["exactly_once"]
    split = m["attribution"]
    assert split["flows"] == 6 and split["paths"] == {"kernel": 6, "spread": 0}
    assert split["path_check_error"] < 0.1        # the paths carry what the counters saw
    with open(folder / "flows.csv") as fh:
        sends = [r for r in csv.DictReader(fh) if r["role"] == "send"]
    rate = m["link_mbps"]
    for r in sends:
        assert r["bottleneck"] == "leaf0>spine0"
        assert rate / 3 * 0.99 <= float(r["fair_mbps"]) <= rate / 2
        parts = sum(float(r[p]) for p in (*("serialization_s", "hops_s", "paused_s", "acks_s",
                                             "recovery_s", "cc_s", "starved_s"),
                                           "unexplained_s"))
        assert parts == pytest.approx(float(r["fct_s"]), abs=1e-5)
    assert (folder / "plots" / "flow_time_split.png").stat().st_size > 0
    assert "## Why the slowest flows took their time" in (folder / "summary.md").read_text()
