"""Pieces of a fabric on several machines, without root: stamps put on one clock
(testbed.spread.correct_clocks), pause frames read and far ports found
(fabric.pause_receiver)."""

from __future__ import annotations

from testbed.spread import correct_clocks


def test_stamps_move_by_their_servers_offset_and_latencies_by_the_difference():
    # a on a server whose clock reads 1,000 ns ahead of ours, b on one 300 ns behind
    configs = {"a": {"steps": [{"sends": [], "recvs": [{"tag": "b>a", "src": "b"}]}]},
               "b": {"steps": [{"sends": [], "recvs": [{"tag": "a>b", "src": "a"},
                                                       {"tag": "c>b", "src": "c"}]}]}}
    results = {
        "a": {"iterations": [{"start_ns": 11_000, "end_ns": 21_000}],
              "flows": [{"start_ns": 11_000, "end_ns": None}], "started_ns": 10_500,
              "done_ns": 21_000, "latency_ns": [["b>a", 0, 5_000]]},
        "b": {"iterations": [{"start_ns": 9_700, "end_ns": 19_700}], "flows": [],
              "started_ns": 9_700, "done_ns": None,
              "latency_ns": [["a>b", 0, 5_000], ["c>b", 0, 7_000]]},
    }
    correct_clocks(results, configs, {"a": 1_000, "b": -300, "c": -300})
    assert results["a"]["iterations"] == [{"start_ns": 10_000, "end_ns": 20_000}]
    assert results["b"]["iterations"] == [{"start_ns": 10_000, "end_ns": 20_000}]
    assert results["a"]["flows"] == [{"start_ns": 10_000, "end_ns": None}]
    assert results["a"]["started_ns"] == 9_500 and results["b"]["done_ns"] is None
    # b's stamp read on a's clock ran 1,300 ns fast: less; a's on b's, 1,300 ns slow: more
    assert results["a"]["latency_ns"] == [["b>a", 0, 3_700]]
    assert results["b"]["latency_ns"] == [["a>b", 0, 6_300], ["c>b", 0, 7_000]]


def test_the_pause_receiver_reads_pfc_frames_as_scapy_builds_them():
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether

    from fabric.wire import PFC_DST_MAC
    from fabric.wire import pause_quanta as parse
    mac = "02:00:c6:12:00:07"

    def pfc_frame(src: str, pause: dict[int, int]) -> bytes:
        fields = {f"c{p}_{k}": v for p, q in pause.items()
                  for k, v in (("enabled", 1), ("pause_time", q))}
        return bytes(Ether(dst=PFC_DST_MAC, src=src) / MACControlClassBasedFlowControl(**fields))

    assert parse(pfc_frame(mac, {3: 0xFFFF}), 3) == 0xFFFF
    assert parse(pfc_frame(mac, {3: 0}), 3) == 0              # resume
    assert parse(pfc_frame(mac, {5: 100}), 3) is None          # another priority
    assert parse(pfc_frame(mac, {3: 7, 5: 100}), 5) == 100
    assert parse(pfc_frame(mac, {3: 7})[:20], 3) is None       # truncated
    not_pfc = bytes.fromhex("0180c2000001" "020000000001" "0800") + bytes(46)
    assert parse(not_pfc, 3) is None


def test_far_ports_are_the_ports_whose_peer_forwards_on_another_machine():
    from types import SimpleNamespace

    from fabric.addressing import plan
    from fabric.pause_receiver import far_ports, has_far_links
    from topologies.files import resolve
    topo = resolve("leaf_spine")
    here = ["leaf0", "l0h0", "l0h1", "spine0"]          # as the partition places them
    part = SimpleNamespace(topo=topo, plan=plan(topo), here=here)
    assert far_ports(part) == [("leaf0", "leaf0-eth3", "spine1"),
                               ("spine0", "spine0-eth1", "leaf1")]
    index = {n: {} for n in here}
    assert has_far_links(part, index)
    whole = SimpleNamespace(topo=topo, plan=plan(topo), here=list(topo.graph.nodes))
    assert far_ports(whole) == [] and not has_far_links(whole, {n: {} for n in whole.here})
