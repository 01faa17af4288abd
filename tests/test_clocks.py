"""Stamps of agents on several machines put on one clock (fabric.spread.correct_clocks;
no root)."""

from __future__ import annotations

from fabric.spread import correct_clocks


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
