"""NSCC (traffic.nscc) as pure state, its CE echo on the wire, its settings; one root test
(a UET incast on a real fabric, cc none against cc nscc)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testbed.cc_results import cc_metrics, summary_line
from testbed.experiment import from_toml
from testbed.run import agent_options, run
from topologies.spec import SpecError
from traffic.agent_config import AgentConfig, ConfigError
from traffic.nscc import NsccSender, NsccSettings, agent_results
from traffic.packets import SACK, Addresses, Opcode, Syndrome, Template
from traffic.parse import parse
from traffic.transport import (
    SEND_ACK,
    SYNDROME_ACK,
    RoceReceiver,
    UetReceiver,
    packet_count,
)
from traffic.transport_settings import TransportParams

MS = 1_000_000
P = NsccSettings(nscc_target_qdelay_us=10.0).nscc_emulated(100, ecn=True)   # target 1 ms
ADDR = Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "198.19.0.1", "198.19.0.2")


def _sender(params: dict = P, n: int = 1000, window: int = 32) -> NsccSender:
    return NsccSender(n, TransportParams(window_packets=window, ack_every=8), params)


def _send(tx: NsccSender, now: int, k: int) -> list[int]:
    return [tx.take(now) for _ in range(k)]


def _ack(tx: NsccSender, now: int, upto: int, ce: int = 0) -> None:
    """A cumulative SACK for every PSN below `upto`, echoing `ce` marks."""
    tx.on_ack(now, SYNDROME_ACK, upto - 1, upto, 0, ce)


# -- the sender's window ------------------------------------------------------------------
def test_ce_with_high_delay_cuts_by_the_delay_excess_at_most_once_per_base_rtt():
    tx = _sender()
    assert tx.cwnd == 32 and _send(tx, 0, 8) == list(range(8))
    _ack(tx, 1 * MS, 8)                        # rtt 1 ms: the base; no CE, no delay
    assert tx.base_rtt_ns == 1 * MS and tx.delay_ns == 0 and tx.cwnd == 32
    _send(tx, 1 * MS, 16)
    _ack(tx, 6 * MS, 16, ce=8)                 # rtt 5 ms: delay 4 ms, above the 1 ms target
    assert tx.delay_ns == 4 * MS
    assert tx.cwnd == pytest.approx(16)        # 1 - min(0.5, 0.8 x 3/4)
    assert tx.cuts == 1 and tx.ce_echoed == 8
    _ack(tx, 6 * MS + MS // 2, 24, ce=8)       # within one base RTT of the cut: none
    assert tx.cwnd == pytest.approx(16) and tx.cuts == 1
    _send(tx, 7 * MS, 4)
    _ack(tx, 9 * MS, 28, ce=1)                 # rtt 2 ms: delay 1 ms = target: cut 0
    assert tx.cuts == 1
    _send(tx, 9 * MS, 4)
    _ack(tx, 12 * MS, 32, ce=1)                # delay 2 ms: 0.8 x 1/2
    assert tx.cwnd == pytest.approx(16 * 0.6) and tx.cuts == 2 and tx.limit == 9


def test_ce_with_low_delay_cuts_by_the_marked_fraction_and_ce_gain_zero_holds():
    tx = _sender()
    _send(tx, 0, 8)
    _ack(tx, 1 * MS, 8, ce=2)                  # delay 0: 0.5 x 2/8
    assert tx.cwnd == pytest.approx(32 * (1 - 0.125)) and tx.cuts == 1
    hold = _sender({**P, "ce_gain": 0.0})      # UET's NSCC: hold (and re-route)
    _send(hold, 0, 8)
    _ack(hold, 1 * MS, 8, ce=8)
    assert hold.cwnd == 32 and hold.cuts == 0 and hold.ce_echoed == 8


def test_without_ce_the_window_grows_proportionally_below_the_target_and_fairly_above():
    tx = _sender()
    _send(tx, 0, 8)
    _ack(tx, 1 * MS, 8, ce=8)                  # base 1 ms; 32 -> 16
    assert tx.cwnd == pytest.approx(16)
    _send(tx, 2 * MS, 8)
    _ack(tx, 3 * MS + MS // 4, 16)             # delay 0.25 ms: 1 x 3/4 x 8 / 16
    assert tx.cwnd == pytest.approx(16 + 0.375)
    before = tx.cwnd
    _send(tx, 4 * MS, 8)
    _ack(tx, 8 * MS, 24)                       # delay 3 ms, no CE: fair, 1 x 8 / cwnd
    assert tx.cwnd == pytest.approx(before + 8 / before) and tx.cuts == 1
    for k in range(3, 100):                    # a whole RTT's worth adds about one packet
        _send(tx, k * 10 * MS, 8)
        _ack(tx, k * 10 * MS + MS, 8 * (k + 1))
    assert tx.cwnd == 32 and tx.limit == 32    # never above window_packets


def test_never_below_min_cwnd_and_the_window_bounds_packets_in_flight():
    tx = _sender({**P, "min_cwnd_packets": 2.0})
    _send(tx, 0, 8)
    _ack(tx, 1 * MS, 8)
    for k in range(1, 30):                     # CE and 4 ms of delay, one cut each
        t = k * 10 * MS
        _send(tx, t, 1)
        _ack(tx, t + 5 * MS, 8 + k, ce=1)
    assert tx.cwnd == 2.0 and tx.lowest == 2.0 and tx.limit == 2
    assert tx.in_flight() == 0
    t = 400 * MS
    assert _send(tx, t, 3) == [37, 38, -1]     # two in flight, the third waits
    assert not tx.ready()
    _ack(tx, t + 1 * MS, 38)
    assert tx.in_flight() == 1 and tx.ready() and tx.take(t + MS) == 39


def test_rtt_is_from_the_newest_newly_acknowledged_send_and_never_from_a_resend():
    tx = _sender(n=3)
    _send(tx, 0, 2)                            # PSN 0, 1 at t = 0
    _send(tx, 3 * MS, 1)                       # PSN 2 at 3 ms
    tx.on_ack(4 * MS, SYNDROME_ACK, 0, 0, 0b110)   # 1 and 2: the newest is 2, sent at 3 ms
    assert tx.rtts == [1 * MS] and tx.base_rtt_ns == 1 * MS
    assert tx.loss_cuts == 1 and list(tx.resend) == [0]     # the tail rule: 0 is lost
    assert tx.cwnd == pytest.approx(31 + 2 / 31)           # -1, then 2 acked at delay 0
    assert tx.take(100 * MS) == 0 and tx.retransmits == 1
    tx.on_ack(101 * MS, SYNDROME_ACK, 2, 3, 0)
    assert tx.done and tx.rtts == [1 * MS]     # Karn: no sample from a resend


def test_every_packet_declared_lost_takes_one_off_the_window():
    params = TransportParams(window_packets=32, ack_every=8, reorder_threshold=3)
    tx = NsccSender(100, params, P)
    _send(tx, 0, 10)
    tx.on_ack(1 * MS, SYNDROME_ACK, 0, 1, 0b1111100)   # 0; 3..7 arrived: 1, 2 lost
    assert tx.loss_cuts == 2 and list(tx.resend) == [1, 2]
    assert tx.cwnd == pytest.approx(30 + 6 / 30)       # then 6 acked below the target
    assert tx.in_flight() == 2                 # 8 and 9


def test_without_ecn_delay_alone_cuts_and_grows():
    tx = _sender({**P, "ecn": False})
    _send(tx, 0, 8)
    _ack(tx, 1 * MS, 8)
    _send(tx, 1 * MS, 8)
    _ack(tx, 6 * MS, 16)                       # no marks to read: the delay cuts
    assert tx.cuts == 1 and tx.cwnd == pytest.approx(16)
    _send(tx, 7 * MS, 8)
    _ack(tx, 8 * MS, 24)                       # delay 0: proportional increase
    assert tx.cwnd == pytest.approx(16 + 8 / 16)


# -- the CE echo on the wire ----------------------------------------------------------------
def test_the_ce_count_rides_in_the_sack_base_words_top_byte_and_round_trips():
    params = TransportParams(window_packets=64, ack_every=8)
    rx = UetReceiver(packet_count(40_000, 1000), 40_000, 1000, params)
    for psn in range(8):
        rx.ce_marks += psn % 2                 # the agent counts CE-marked arrivals
        action = rx.on_data(psn, psn == 7)
    assert action == SEND_ACK
    syndrome, psn, word, bitmap = rx.ack_fields(action)
    assert (word & 0xFFFFFF, word >> 24, bitmap) == (8, 4, 0) and rx.ce_marks == 0
    rx.ce_marks = 300                          # saturates at 255
    assert rx.ack_fields(SEND_ACK)[2] >> 24 == 255
    for udp_checksum in (False, True):         # the fast patcher and patch_ack
        t = Template.build(Opcode.RC_ACK, ADDR, dqpn=0x800011, sack=True,
                           udp_checksum=udp_checksum)
        patch = t.ack_patcher(t.buffer())
        patch(psn, 50000, syndrome, 42, word, 0b101)
        got = parse(patch.buf)
        assert got["icrc_ok"] and got["sack_base_psn"] == 8 and got["sack_ce_count"] == 4
        assert got["sack_bitmap"] == 0b101 and got["msn"] == 42
        layer = t.packet.__class__(bytes(patch.buf))[SACK]      # scapy decodes it too
        assert (layer.ce_count, layer.base_psn, layer.bitmap) == (4, 8, 0b101)


def test_roce_acks_carry_no_ce_count():
    params = TransportParams(window_packets=64, ack_every=4)
    marked, clean = (RoceReceiver(10, 10_000, 1000, params) for _ in range(2))
    for rx in (marked, clean):
        for psn in range(4):
            rx.ce_marks += rx is marked
            rx.on_data(psn, psn == 3)
    assert marked.ack_fields(SEND_ACK) == clean.ack_fields(SEND_ACK) == (SYNDROME_ACK, 3, 4, 0)
    t = Template.build(Opcode.RC_ACK, ADDR, dqpn=0x11)
    bufs = []
    for rx in (marked, clean):
        patch = t.ack_patcher(t.buffer())
        syndrome, psn, base, bitmap = rx.ack_fields(SEND_ACK)
        patch(psn, 50000, syndrome, 7, base, bitmap)
        bufs.append(bytes(patch.buf))
    assert bufs[0] == bufs[1] and len(bufs[0]) == len(t.frame)     # no SACK block
    assert parse(bufs[0])["syndrome"] == Syndrome.ACK and "sack_ce_count" not in parse(bufs[0])


# -- settings, agent config, results ------------------------------------------------------
def _exp(**kw):
    base = {"topology": {"kind": "leaf_spine"}, "workload": "incast", "transport": "uet"}
    return from_toml(None, {**base, **kw})


def test_settings_scale_name_the_bad_key_and_reach_the_agents():
    assert NsccSettings().nscc_emulated(400)["target_ns"] == int(4.8 * MS)
    with pytest.raises(SpecError, match="experiment.cc.*UET"):
        _exp(cc="nscc", transport="roce")
    with pytest.raises(SpecError, match="experiment.cc.*RoCE"):
        _exp(cc="dcqcn", pfc="off", ecn="on")
    with pytest.raises(SpecError, match="experiment.nscc_gamma"):
        _exp(cc="nscc", nscc_gamma=0.0)
    with pytest.raises(SpecError, match="experiment.nscc_max_md"):
        _exp(cc="nscc", nscc_max_md=1.0)
    with pytest.raises(SpecError, match="experiment.nscc_min_cwnd_packets"):
        _exp(cc="nscc", nscc_min_cwnd_packets=0.5)
    delay_only = agent_options(_exp(cc="nscc", nscc_target_qdelay_us=5.0), 100)["nscc"]
    assert delay_only["target_ns"] == 500_000 and delay_only["ecn"] is False
    marks = agent_options(_exp(cc="nscc", pfc="off", ecn="on"), 100)["nscc"]
    assert marks["ecn"] is True and agent_options(_exp(), 100)["nscc"] == {}


def test_agent_config_checks_nscc():
    base = {"node": "a", "loopback": "198.19.0.1", "transport": "uet", "entropy": "spray",
            "payload_bytes": 1000, "ports": {}, "routes": {}, "peers": {}, "steps": [],
            "results_path": "/dev/null", "cc": "nscc"}
    with pytest.raises(ConfigError, match="nscc: missing"):
        AgentConfig.from_dict(base)
    with pytest.raises(ConfigError, match="transport uet"):
        AgentConfig.from_dict({**base, "transport": "roce", "nscc": P})
    assert AgentConfig.from_dict({**base, "nscc": P}).nscc == P


def test_results_pool_flows_per_pair_and_summarise():
    a, b = _sender(), _sender()
    _send(a, 0, 8)
    _ack(a, 1 * MS, 8)
    _send(a, 1 * MS, 8)
    _ack(a, 6 * MS, 16, ce=3)
    _send(b, 0, 8)
    _ack(b, 2 * MS, 8)
    sends = [SimpleNamespace(dst="r", tx=a), SimpleNamespace(dst="r", tx=b),
             SimpleNamespace(dst="q", tx=None)]
    part = agent_results(sends, 0, P)
    assert part["algorithm"] == "nscc" and part["ecn"] and part["target_us"] == 1000
    r = part["peers"]["r"]
    assert (r["flows"], r["ce_echoed"], r["cuts"], r["lowest_cwnd"]) == (2, 3, 1, 16.0)
    assert (r["rtt_samples"], r["base_rtt_us"], r["rtt_p99_us"]) == (3, 1000.0, 5000.0)
    m = cc_metrics({"s": {"cc": part}, "r": {"cc": {**agent_results([], 5, P)}}}, None)
    assert (m["ce_packets"], m["ce_echoed"], m["cuts"], m["lowest_cwnd"]) == (5, 3, 1, 16.0)
    assert list(m["pairs"]) == ["s>r"] and m["base_rtt_ms"] == 1.0
    assert summary_line(m).startswith("- congestion control nscc (CE marks and delay")


# -- on a real fabric -----------------------------------------------------------------------
SCALE = 400     # 100 Mbit/s for 40 Gb/s: the 12 us target is 4.8 ms, 15 frames of queue


def _incast(tmp_path, name: str, **kw):
    """5:1 UET incast, sprayed, ECN without PFC. window_packets 16: the first window goes
    out before any feedback can come back (five senders x 64 packets alone would drop
    ~220 at the 32-frame port), and UET's NSCC starts near 1.5 BDP, not at 64 packets."""
    settings = {"name": name, "workload": "incast", "message_bytes": 1 << 20,
                "iterations": 1, "transport": "uet", "entropy": "spray", "pfc": "off",
                "ecn": "on", "window_packets": 16, "results_dir": str(tmp_path),
                "timeout_s": 90.0, "rto_ms": 50.0,
                "topology": {"kind": "leaf_spine", "scale_factor": SCALE, "params": {
                    "leaves": 2, "spines": 1, "hosts_per_leaf": 3}}}
    settings.update(kw)
    return from_toml(None, settings)


@pytest.mark.root
def test_nscc_incast_loses_far_fewer_packets_and_every_window_falls(tmp_path, host_untouched):
    """The same incast with cc none and cc nscc: every byte arrives exactly once in both;
    with NSCC the receivers echo CE marks, every sender cuts its window, and the port into
    the receiver drops far fewer packets."""
    folder_none, none = run(_incast(tmp_path, "t_nscc_none", cc="none"))
    folder, nscc = run(_incast(tmp_path, "t_nscc", cc="nscc"))
    assert none["flows"]["exactly_once"] and nscc["flows"]["exactly_once"]
    assert none["flows"]["count"] == nscc["flows"]["count"] == 5
    lost_none = none["pfc"]["totals"]["drops"]
    lost_nscc = nscc["pfc"]["totals"]["drops"]
    assert none["cc"] is None
    assert lost_none > 0 and 3 * lost_nscc < lost_none, (lost_nscc, lost_none)
    cc = nscc["cc"]
    assert cc["algorithm"] == "nscc" and cc["ecn"] and cc["target_ms"] == 12e-3 * SCALE
    assert 0 < cc["ce_echoed"] <= cc["ce_packets"]
    assert len(cc["pairs"]) == 5
    for pair, p in cc["pairs"].items():
        assert p["ce_echoed"] > 0 and p["cuts"] >= 1, pair
        assert p["lowest_cwnd"] <= p["start_cwnd"] / 2, pair
        assert p["rtt_samples"] > 0 and p["base_rtt_us"] <= p["rtt_p50_us"], pair
    assert "congestion control nscc" in (folder / "summary.md").read_text()
