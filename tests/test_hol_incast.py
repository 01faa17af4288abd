"""Claim 2's fabric (testbed.hol_incast): where a run's backpressure reached, read from
its pfc.json, and the models the scripts compare it with."""

from __future__ import annotations

import pytest

from testbed.hol_incast import incast_jct_s, line_goodput_mbps, measure, pause_reach


def port(xoff: int) -> dict:
    return {"xoff_frames": xoff, "frames_sent": xoff}


def pair(switch: str, upstream: str, dest: str, holds: int) -> dict:
    return {"switch": switch, "ifname": f"{switch}-eth0", "upstream": upstream,
            "dest": dest, "holds": holds, "held_s": 0.1 * holds, "frames_sent": 2 * holds,
            "peak_bytes": 1000}


def test_pfc_reach_counts_the_switches_that_sent_an_xoff():
    report = {"ports": {"leaf0:leaf0-eth0": port(3), "leaf0:leaf0-eth4": port(1),
                        "spine0:spine0-eth0": port(2), "leaf1:leaf1-eth0": port(0),
                        "l0h0:l0h0-eth0": port(0)}}
    got = pause_reach(report)
    assert got["switches_that_paused"] == ["leaf0", "spine0"] and got["pause_hops"] == 2
    assert not got["voq"] and got["held_destinations"] == [] and got["held_elsewhere"] == 0


def test_voq_reach_counts_held_queues_toward_other_destinations():
    pairs = [pair("leaf0", "l0h0", "l1h0", 4), pair("spine0", "leaf0", "l1h0", 2),
             pair("leaf1", "spine0", "l1h1", 1),           # the victim's queue held once
             pair("spine0", "leaf0", "l1h2", 0)]           # filled, never held: no count
    report = {"ports": {"leaf0:leaf0-eth0": port(4), "leaf1:leaf1-eth4": port(1),
                        "spine0:spine0-eth0": port(2)},
              "voq": {"enabled": True, "held_queues": 3, "held_destinations": ["l1h0", "l1h1"],
                      "held_links": ["l0h0>leaf0", "leaf0>spine0", "spine0>leaf1"],
                      "pairs": pairs}}
    got = pause_reach(report)
    assert got["voq"] and got["pause_hops"] == 3 and got["held_queues"] == 3
    assert got["held_elsewhere"] == 1                     # only the l1h1 queue
    assert pause_reach(report, receiver="l1h1")["held_elsewhere"] == 2


def test_models_and_a_bad_mode():
    # 4096 B of payload in a 4154 B frame at 100 Mbit/s; 3 flows of 1 MB through 100 Mbit/s
    assert line_goodput_mbps(4096) == pytest.approx(100 * 4096 / 4154)
    assert incast_jct_s(1_000_000) == pytest.approx(0.24)
    with pytest.raises(ValueError, match="one of off, on, voq"):
        measure(None, "both", None)
