"""What a results folder says of congestion control, from the agents' figures (no root):
the share of a receiver's link DCQCN's rates left its senders, on constructed cases."""

from __future__ import annotations

import pytest

from testbed.cc_results import dcqcn_held, held_line

MS = 1_000_000
T0 = 10**12             # the agents' clock (CLOCK_MONOTONIC ns); 0 means "never"


def agents(rates: dict[str, list[list]], flows: dict[str, list[tuple[int, int, int]]],
           line: float = 100.0) -> dict:
    """Senders s -> the receiver r: each QP's logged rate changes, each sender's flows
    (iteration, start ns, end ns), all from T0."""
    out = {"r": {"flows": [], "cc": {"qps": {}}}}
    for src in flows:
        out[src] = {"flows": [{"role": "send", "src": src, "dst": "r", "iteration": it,
                               "start_ns": T0 + s, "end_ns": T0 + e}
                              for it, s, e in flows[src]],
                    "cc": {"qps": {"r": {"line_mbps": line, "rate_mbps": [
                        [T0 + t, r] for t, r in rates.get(src, [])]}}}}
    return out


def test_two_senders_held_at_a_quarter_for_half_the_time_use_three_quarters():
    # both at line rate until 50 ms (200 Mbit/s offered: the link is full), then both at
    # 25 Mbit/s (50 of 100): the mean is (1 x 50 + 0.5 x 50) / 100
    a = agents({"s1": [[50 * MS, 25.0]], "s2": [[50 * MS, 25.0]]},
               {"s1": [(0, 0, 100 * MS)], "s2": [(0, 0, 100 * MS)]})
    held = dcqcn_held(a)
    assert held == {"receiver": "r", "allowed_fraction": 0.75, "senders": 2,
                    "link_mbps": 100.0}


def test_a_rate_set_before_the_flow_started_holds_from_its_start_and_ends_with_it():
    # s1 was cut to 40 before its flow began; s2 joins at 60 Mbit/s for the second half
    a = agents({"s1": [[-5 * MS, 40.0]], "s2": [[0, 60.0]]},
               {"s1": [(0, 0, 100 * MS)], "s2": [(0, 50 * MS, 100 * MS)]})
    # 0-50 ms: 40 of 100; 50-100 ms: 100 of 100
    assert dcqcn_held(a)["allowed_fraction"] == pytest.approx(0.7)


def test_iterations_are_averaged_and_the_gaps_between_them_do_not_count():
    a = agents({"s1": [[10 * MS, 50.0], [500 * MS, 100.0]]},
               {"s1": [(0, 0, 20 * MS), (1, 500 * MS, 520 * MS)]})
    # iteration 0: 10 ms at 1, 10 ms at 0.5 (0.75); iteration 1: all at line (1)
    assert dcqcn_held(a)["allowed_fraction"] == pytest.approx(0.875)


def test_no_rate_change_no_figure_and_the_line_compares_prediction_to_measurement():
    assert dcqcn_held(agents({}, {"s1": [(0, 0, MS)]})) is None
    held = {"receiver": "r", "allowed_fraction": 0.5, "senders": 8, "link_mbps": 100.0}
    assert "predicts JCT/ideal 2 (1 / share); measured 2.04: DCQCN's rates explain it" \
        in held_line(held, 2.04)
    assert "+25.0% of it is not DCQCN's doing" in held_line(held, 2.5)
    assert held_line(None, 2.0) == ""
