"""DCQCN (traffic.cc) as pure state machines, and its settings; no root needed."""

from __future__ import annotations

import pytest

from testbed.experiment import from_toml
from topologies.spec import SpecError
from traffic.cc import CnpGate, Dcqcn, DcqcnSettings, held_cnps

MS = 1_000_000
# Emulated parameters at scale factor 100: 5 ms CNP interval, 5.5 ms timers.
P = DcqcnSettings().dcqcn_emulated(100)


def test_real_units_scale_to_the_emulated_fabric():
    assert P["cnp_interval_ns"] == 5 * MS and P["timer_ns"] == int(5.5 * MS)
    p4000 = DcqcnSettings().dcqcn_emulated(4000)
    assert p4000["cnp_interval_ns"] == 200 * MS and p4000["timer_ns"] == 220 * MS
    assert p4000["byte_counter_bytes"] == 10_000_000 and p4000["g"] == 1 / 256


def test_a_cnp_cuts_the_rate_by_alpha_over_two_and_raises_alpha():
    cc = Dcqcn(100, P)
    assert not cc.active and cc.rc == 100e6
    cc.on_cnp(0)
    assert cc.active and cc.rc == pytest.approx(50e6) and cc.rt == 100e6
    assert cc.alpha == pytest.approx(1.0)            # (1 - g) 1 + g
    cc.on_cnp(1 * MS)                                # before any timer: alpha still 1
    assert cc.rc == pytest.approx(25e6) and cc.rt == pytest.approx(50e6)
    assert cc.cuts == 2 and cc.lowest == pytest.approx(25e6)


def test_alpha_decays_by_one_minus_g_per_timer_without_a_cnp():
    cc = Dcqcn(100, P)
    cc.on_cnp(0)
    cc.tick(P["timer_ns"] * 10)
    assert cc.alpha == pytest.approx((1 - 1 / 256) ** 10)
    before = cc.rc
    cc.on_cnp(P["timer_ns"] * 10)                    # cut by the decayed alpha / 2
    assert cc.rc == pytest.approx(before * (1 - (1 - 1 / 256) ** 10 / 2))


def test_fast_recovery_then_additive_then_hyper_increase_back_to_line_rate():
    cc = Dcqcn(100, P)
    cc.on_cnp(0)
    t = P["timer_ns"]
    rates = []
    for k in range(1, 6):                            # F = 5 fast-recovery events
        cc.tick(k * t)
        rates.append(cc.rc)
        assert cc.rt == 100e6                        # the target stays
    assert rates[0] == pytest.approx(75e6)           # half way back each time
    assert 100e6 - rates[-1] == pytest.approx(50e6 / 32)
    cc.tick(6 * t)                                   # timer stage 6 > F, bytes 0: additive
    assert cc.rt == pytest.approx(100e6)             # clamped at the line rate
    assert not cc.active or cc.rc > rates[-1]
    # the byte counter: hyper increase once both counters passed F
    cc2 = Dcqcn(100, P)
    cc2.on_cnp(0)
    cc2.on_cnp(1)                                    # down to 25 Mbit/s, target 50
    cc2.t_stage = cc2.b_stage = 6
    rt = cc2.rt
    cc2._increase(2)
    assert cc2.rt == pytest.approx(rt + 0.01 * 100e6)    # + R_HAI


def test_back_at_line_rate_it_stops_pacing_and_timers():
    cc = Dcqcn(100, P)
    cc.on_cnp(0)
    k = 1
    while cc.active and k < 10_000:
        cc.tick(k * P["timer_ns"])
        k += 1
    assert not cc.active and cc.rc == 100e6 and cc.tick(k * P["timer_ns"]) is None
    assert cc.increases >= 5 and cc.timeline[-1][1] == 100e6


def test_pacing_spaces_packets_at_the_current_rate_with_a_bounded_burst():
    cc = Dcqcn(100, P, burst_ns=1 * MS)
    cc.on_sent(0, 4000)                              # inactive: no pacing at all
    assert cc.next_ns == 0
    cc.on_cnp(0)                                     # 50 Mbit/s: 4000 B = 640 us
    cc.on_sent(0, 4000)
    assert cc.next_ns == pytest.approx(640_000)
    cc.on_sent(100 * MS, 4000)                       # a late sender gets 1 ms of credit
    assert cc.next_ns == pytest.approx(100 * MS - 1 * MS + 640_000)


def test_byte_counter_raises_the_rate_every_b_bytes():
    cc = Dcqcn(100, {**P, "byte_counter_bytes": 8000}, burst_ns=0)
    cc.on_cnp(0)
    cc.on_sent(0, 4000)
    assert cc.b_stage == 0
    cc.on_sent(0, 4000)
    assert cc.b_stage == 1 and cc.rc == pytest.approx(75e6)


def test_cnp_gate_sends_at_most_one_cnp_per_interval():
    gate = CnpGate(5 * MS)
    sent = [gate.on_ce(t * MS // 2) for t in range(40)]     # a mark every 0.5 ms, 20 ms
    assert sum(sent) == 4 and sent[0] and sent[10] and not sent[9]
    assert gate.ce == 40 and gate.sent == 4


def test_cnp_gate_holds_marks_for_the_end_of_the_interval():
    """The paper's NP: marks within an interval get one CNP when it ends, none if none."""
    gate = CnpGate(5 * MS, flow="f")
    assert gate.on_ce(0) and not gate.held
    assert held_cnps([gate], 1 * MS, 10 * MS) == ([], 5 * MS)   # wake when it ends
    assert not gate.on_ce(2 * MS) and gate.held                  # held, not dropped
    assert held_cnps([gate], 4 * MS, 10 * MS) == ([], 5 * MS)
    assert held_cnps([gate], 5 * MS + 10, 10 * MS) == ([gate], 10 * MS)
    assert gate.sent == 2 and not gate.held and gate.last_ns == 5 * MS + 10
    assert held_cnps([gate], 11 * MS, 20 * MS) == ([], 20 * MS)   # no mark: no CNP
    assert gate.sent == 2 and gate.on_ce(12 * MS) and gate.sent == 3


def _exp(**kw):
    base = {"topology": {"kind": "leaf_spine"}, "workload": "incast"}
    return from_toml(None, {**base, **kw})


def test_settings_name_the_bad_key():
    with pytest.raises(SpecError, match="experiment.cc.*ecn"):
        _exp(cc="dcqcn")
    with pytest.raises(SpecError, match="experiment.cc.*RoCE"):
        _exp(cc="dcqcn", transport="uet", pfc="off", ecn="on")
    with pytest.raises(SpecError, match="experiment.cc.*none, dcqcn"):
        _exp(cc="reno")
    with pytest.raises(SpecError, match="experiment.dcqcn_g"):
        _exp(cc="dcqcn", pfc="off", ecn="on", dcqcn_g=2.0)
    with pytest.raises(SpecError, match="experiment.dcqcn_fast_recovery"):
        _exp(cc="dcqcn", pfc="off", ecn="on", dcqcn_fast_recovery=2.5)
    exp = _exp(cc="dcqcn", pfc="off", ecn="on", dcqcn_timer_us=100.0)
    assert exp.dcqcn_emulated(10)["timer_ns"] == 1 * MS
