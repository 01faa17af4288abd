"""Tests for traffic.transport (state machines, entropy) and traffic.agent / traffic.launch.

Without root: both transports driven through a simulated link with chosen drops,
reordering and duplicates; entropy modes; the agent's config checks; parse_bth.
As root: agents on real fabrics — p2p transfers, random drops from nftables in a router
namespace, spraying over unequal spines, a ring all-reduce, timeouts and SIGTERM.
"""

from __future__ import annotations

import heapq
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from traffic import entropy as tp
from traffic.entropy import Entropy
from traffic.packets import Addresses, Opcode, Syndrome, Template
from traffic.parse import parse_bth
from traffic.transport import (
    NO_ACTION,
    SEND_ACK,
    SEND_NAK,
    SYNDROME_ACK,
    SYNDROME_NAK_SEQ,
    RoceReceiver,
    RoceSender,
    UetReceiver,
    UetSender,
    make_receiver,
    make_sender,
    packet_bytes,
    packet_count,
)
from traffic.transport_settings import TransportParams

US = 1_000
WIDE = TransportParams(window_packets=64, ack_every=4, rto_ms=5)   # never window-bound here


# -- a simulated link ---------------------------------------------------------------------
class Sim:
    """One sender and one receiver joined by a link with per-packet fates.

    The sender puts one packet on the wire every `gap_ns` while its window allows; data
    takes `delay(psn, nth)` ns (nth = 0 for the first transmission of that PSN, 1 for the
    second ...); `drop(psn, nth)` loses it, `dup(psn, nth)` delivers it twice; ACKs take
    `ack_delay_ns` and are lost when `drop_ack(k)` says so (k = the k-th ACK).
    """

    def __init__(self, transport: str, size_bytes: int, *, payload: int = 1000,
                 params: TransportParams | None = None, gap_ns: int = 10 * US,
                 delay: Callable[[int, int], int] = lambda psn, nth: 100 * US,
                 drop: Callable[[int, int], bool] = lambda psn, nth: False,
                 dup: Callable[[int, int], bool] = lambda psn, nth: False,
                 drop_ack: Callable[[int], bool] = lambda k: False,
                 ack_delay_ns: int = 100 * US):
        self.params = params or TransportParams(window_packets=16, ack_every=4, rto_ms=5)
        n = packet_count(size_bytes, payload)
        self.tx = make_sender(transport, n, self.params)
        self.rx = make_receiver(transport, size_bytes, payload, self.params)
        self.gap_ns, self.delay, self.drop, self.dup = gap_ns, delay, drop, dup
        self.drop_ack, self.ack_delay_ns = drop_ack, ack_delay_ns
        self.sent: list[int] = []          # PSNs in transmission order
        self.acks: list[tuple[int, int, int, int]] = []
        self.dropped = 0

    def run(self, limit_ns: int = 10_000_000_000) -> int:
        """Run until the sender is done and nothing is in flight; return the end time."""
        self.events: list[tuple[int, int, str, tuple]] = []
        self.seq = 0
        t = next_send = last_arrival = 0
        nth: dict[int, int] = {}
        tx, rx = self.tx, self.rx
        while not tx.done or self.events:
            candidates = [self.events[0][0]] if self.events else []
            if tx.ready():
                candidates.append(next_send)
            if tx.deadline_ns() is not None:
                candidates.append(tx.deadline_ns())
            if rx.since_ack:
                candidates.append(last_arrival + self.params.ack_delay_ns)
            assert candidates, "simulation stalled"
            t = max(t, min(candidates))
            assert t < limit_ns, "simulation ran past its time limit"
            tx.on_timer(t)
            if t >= next_send and (psn := tx.take(t)) >= 0:
                k = nth.get(psn, 0)
                nth[psn] = k + 1
                self.sent.append(psn)
                if self.drop(psn, k):
                    self.dropped += 1
                else:
                    for _ in range(2 if self.dup(psn, k) else 1):
                        self._push(t + self.delay(psn, k), "data", (psn, tx.ackreq(psn), t))
                next_send = t + self.gap_ns
            while self.events and self.events[0][0] <= t:
                _, _, kind, body = heapq.heappop(self.events)
                if kind == "data":
                    last_arrival = t
                    self._answer(rx.on_data(*body), t)
                else:
                    tx.on_ack(t, *body)
            if rx.since_ack and t >= last_arrival + self.params.ack_delay_ns:
                self._answer(rx.delayed_ack(), t)
        return t

    def _push(self, at: int, kind: str, body: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, body))

    def _answer(self, action: int, t: int) -> None:
        if action != NO_ACTION:
            fields = self.rx.ack_fields(action)
            self.acks.append(fields)
            if not self.drop_ack(len(self.acks) - 1):
                self._push(t + self.ack_delay_ns, "ack", fields)


# -- roce ---------------------------------------------------------------------------------
def test_roce_delivers_in_order_without_loss():
    sim = Sim("roce", 100_000)
    sim.run()
    tx, rx = sim.tx, sim.rx
    assert sim.sent == list(range(100))
    assert tx.done and (tx.retransmits, tx.naks, tx.timeouts) == (0, 0, 0)
    assert rx.exactly_once and rx.bytes_delivered == 100_000
    assert (rx.ooo_packets, rx.dup_packets, rx.naks, rx.max_reorder) == (0, 0, 0, 0)
    assert rx.acks == 25                       # one per ack_every (4) packets


def test_roce_sender_window_and_ackreq():
    tx = RoceSender(20, TransportParams(window_packets=8, ack_every=4))
    assert [tx.take(0) for _ in range(10)] == list(range(8)) + [-1, -1]
    assert [p for p in range(20) if tx.ackreq(p)] == [3, 7, 11, 15, 19]
    tx.on_ack(1, SYNDROME_ACK, 3)
    assert tx.una == 4 and [tx.take(2) for _ in range(5)] == [8, 9, 10, 11, -1]


def test_roce_nak_once_per_gap_then_go_back_n_from_the_naked_psn():
    sim = Sim("roce", 60_000, drop=lambda psn, nth: psn == 10 and nth == 0)
    sim.run()
    tx, rx = sim.tx, sim.rx
    assert rx.naks == 1 and tx.naks == 1       # many packets arrived past the gap, one NAK
    assert rx.ooo_packets > 1
    first_resend = sim.sent.index(10, 11)
    high = max(sim.sent[:first_resend])
    assert sim.sent[first_resend:first_resend + high - 9] == list(range(10, high + 1))
    assert tx.retransmits == high - 9          # everything from 10 up to the highest sent
    assert rx.exactly_once and tx.timeouts == 0


def test_roce_receiver_discards_ahead_and_reacks_duplicates():
    rx = RoceReceiver(8, 8000, 1000, TransportParams(ack_every=4))
    assert [rx.on_data(p, p == 3) for p in (0, 1)] == [NO_ACTION, NO_ACTION]
    assert rx.on_data(3, True) == SEND_NAK                 # gap: 2 is missing
    assert rx.ack_fields(SEND_NAK) == (SYNDROME_NAK_SEQ, 2, 2, 0)
    assert rx.on_data(4, False) == NO_ACTION               # still the same gap: no NAK
    assert rx.on_data(2, False) == NO_ACTION
    assert rx.on_data(3, True) == SEND_ACK                 # AckReq
    assert rx.ack_fields(SEND_ACK)[:2] == (SYNDROME_ACK, 3)
    assert rx.on_data(1, False) == SEND_ACK                # first of a duplicate run
    assert rx.on_data(2, False) == NO_ACTION
    assert rx.on_data(5, False) == SEND_NAK                # ePSN moved: a new gap, a new NAK
    assert (rx.dup_packets, rx.ooo_packets, rx.naks) == (2, 3, 2)
    assert not rx.complete and rx.bytes_delivered == 4000


def test_go_back_n_state_machine():
    tx = RoceSender(30, TransportParams(window_packets=16, ack_every=4))
    assert [tx.take(0) for _ in range(12)] == list(range(12))
    tx.on_ack(5, SYNDROME_NAK_SEQ, 5)
    assert (tx.una, tx.next, tx.naks) == (5, 5, 1)
    assert [tx.take(6) for _ in range(3)] == [5, 6, 7] and tx.retransmits == 3
    tx.on_ack(7, SYNDROME_NAK_SEQ, 3)                      # stale: below una, ignored
    assert (tx.una, tx.next) == (5, 8)


def test_roce_recovers_a_lost_tail_and_a_lost_nak_by_timeout():
    sim = Sim("roce", 40_000, drop=lambda psn, nth: psn == 39 and nth == 0)
    end = sim.run()
    assert sim.tx.timeouts == 1 and sim.tx.naks == 0 and sim.rx.exactly_once
    assert end >= sim.params.rto_ns
    # The only NAK is lost: the receiver stays silent until the timer goes back N.
    sim = Sim("roce", 40_000, drop=lambda psn, nth: psn == 5 and nth == 0,
              drop_ack=lambda k: k == 1)
    sim.run()
    assert sim.rx.naks == 1 and sim.tx.naks == 0 and sim.tx.timeouts == 1
    assert sim.rx.exactly_once


def test_roce_reordering_costs_naks_and_resends():
    swapped = {10, 30, 50, 70}                 # these arrive after the next two packets
    sim = Sim("roce", 100_000, params=WIDE,
              delay=lambda psn, nth: (125 if psn in swapped and nth == 0 else 100) * US)
    sim.run()
    # Each swap costs a NAK, then often a second one: originals still in flight arrive
    # after the late packet moved ePSN on (the go-back-N pathology of RC on spraying).
    assert 4 <= sim.rx.naks <= 8 and sim.tx.naks == sim.rx.naks
    assert sim.tx.retransmits > sim.rx.naks and sim.rx.exactly_once


# -- uet ----------------------------------------------------------------------------------
def test_uet_accepts_reordering_without_resending():
    swapped = {10, 30, 50, 70}          # each overtaken by the next two packets
    sim = Sim("uet", 100_000, params=WIDE,
              delay=lambda psn, nth: (125 if psn in swapped and nth == 0 else 100) * US)
    sim.run()
    tx, rx = sim.tx, sim.rx
    assert (tx.retransmits, tx.naks, tx.timeouts) == (0, 0, 0)
    assert rx.ooo_packets == 8 and rx.max_reorder == 2 and rx.naks == 0
    assert rx.exactly_once and rx.bytes_delivered == 100_000


def test_uet_random_reordering_within_the_threshold():
    import random
    rng = random.Random(7)
    jitter = {p: rng.randrange(0, 150 * US) for p in range(300)}
    params = TransportParams(window_packets=64, ack_every=8, rto_ms=50, reorder_threshold=32)
    sim = Sim("uet", 300_000, params=params,
              delay=lambda psn, nth: 100 * US + jitter[psn])
    sim.run()
    assert sim.rx.max_reorder > 2 and sim.rx.ooo_packets > 20
    assert sim.tx.retransmits == 0 and sim.rx.exactly_once


def test_uet_resends_only_the_missing_psns():
    lost = {10, 50, 51}
    params = TransportParams(window_packets=64, ack_every=4, rto_ms=50, reorder_threshold=8)
    sim = Sim("uet", 100_000, params=params, drop=lambda psn, nth: psn in lost and nth == 0)
    sim.run()
    tx, rx = sim.tx, sim.rx
    assert tx.retransmits == 3 and sorted(sim.sent) == sorted([*range(100), *lost])
    assert (tx.naks, tx.timeouts, rx.naks) == (0, 0, 0)
    assert rx.exactly_once and rx.dup_packets == 0


def test_uet_sack_fields_and_duplicates():
    rx = UetReceiver(10, 10_000, 1000, TransportParams(ack_every=8))
    for p in (0, 1, 3, 4, 6):
        rx.on_data(p, False)
    assert (rx.base, rx.ooo_packets) == (2, 3)
    assert rx.ack_fields(SEND_ACK) == (SYNDROME_ACK, 1, 2, 0b10110)
    assert rx.on_data(3, False) == SEND_ACK and rx.dup_packets == 1
    rx.on_data(2, False)
    assert rx.base == 5
    tx = UetSender(10, TransportParams(window_packets=10, reorder_threshold=2))
    assert [tx.take(0) for _ in range(7)] == list(range(7))
    tx.on_ack(1, SYNDROME_ACK, 4, 5, 0b10)                 # 0..4 and 6: 5 is missing
    assert tx.una == 5 and tx.acked[6] and not tx.resend    # only one later packet
    assert tx.take(2) == 7 and tx.take(3) == 8
    tx.on_ack(4, SYNDROME_ACK, 4, 5, 0b1110)               # 6, 7, 8: three later
    assert list(tx.resend) == [5]
    assert tx.take(5) == 5 and tx.retransmits == 1
    tx.on_ack(6, SYNDROME_ACK, 4, 5, 0b11110)              # later than the resend? no
    assert not tx.resend


def test_uet_exactly_once_with_duplicates_injected():
    sim = Sim("uet", 123_457, dup=lambda psn, nth: psn % 3 == 0,
              delay=lambda psn, nth: (100 + 7 * (psn % 5)) * US)
    sim.run()
    rx = sim.rx
    assert rx.dup_packets == len(range(0, 124, 3))
    assert rx.exactly_once and rx.bytes_delivered == 123_457
    assert rx.delivered.count(1) == 124 and rx.double_deliveries == 0
    roce = Sim("roce", 123_457, dup=lambda psn, nth: psn % 3 == 0)
    roce.run()
    assert roce.rx.exactly_once and roce.rx.dup_packets == 42


def test_uet_recovers_a_lost_tail_by_timeout():
    sim = Sim("uet", 40_000, drop=lambda psn, nth: psn >= 38 and nth == 0)
    sim.run()
    assert sim.tx.timeouts >= 1 and sim.tx.retransmits == 2 and sim.rx.exactly_once


def test_uet_finds_a_loss_near_the_tail_without_a_timeout():
    # 30 of 40 is lost: fewer than reorder_threshold (32) packets follow it, so only the
    # tail rule (everything sent after it acknowledged) finds it before the RTO.
    sim = Sim("uet", 40_000, drop=lambda psn, nth: psn == 30 and nth == 0)
    end = sim.run()
    assert sim.params.reorder_threshold > 10
    assert (sim.tx.timeouts, sim.tx.retransmits) == (0, 1) and sim.rx.exactly_once
    assert end < sim.params.rto_ns
    # the last packet itself has nothing after it: that one still takes the RTO
    sim = Sim("uet", 40_000, drop=lambda psn, nth: psn == 39 and nth == 0)
    assert sim.run() >= sim.params.rto_ns and sim.tx.timeouts == 1


def test_exactly_once_flag_catches_a_double_delivery():
    rx = RoceReceiver(2, 2000, 1000, TransportParams())
    rx.on_data(0, False)
    rx.on_data(1, True)
    assert rx.exactly_once
    rx._deliver(1)                      # what a broken transport would do
    assert not rx.exactly_once


def test_packet_arithmetic():
    assert packet_count(0, 4096) == 1 and packet_count(4096, 4096) == 1
    assert packet_count(4097, 4096) == 2
    assert packet_bytes(1, 4097, 4096) == 1 and packet_bytes(0, 0, 4096) == 0
    with pytest.raises(ValueError):
        packet_count(1 << 40, 16)
    with pytest.raises(ValueError):
        TransportParams(window_packets=0)
    with pytest.raises(ValueError):
        make_sender("tcp", 1, TransportParams())


# -- entropy ------------------------------------------------------------------------------
def test_entropy_modes():
    ecmp = Entropy("ecmp", 1, "flow")
    assert {ecmp.port(t) for t in range(0, 10**9, 10**6)} == {ecmp.fixed}
    assert tp.SPORT_MIN <= ecmp.fixed < tp.SPORT_MIN + tp.SPORT_SPAN
    spray = Entropy("spray", 1, "flow")
    ports = [spray.port() for _ in range(1000)]
    assert len(set(ports)) > 900 and all(49152 <= p <= 65535 for p in ports)
    flowlet = Entropy("flowlet", 1, "flow", flowlet_gap_us=200)
    times = [0, 50, 100, 150, 400, 450, 500, 1000] + [1100 + 100 * i for i in range(10)]
    got = [flowlet.port(t * US) for t in times]
    assert got[:4] == [got[0]] * 4                     # gaps of 50 us: one flowlet
    assert got[4] != got[3] and got[4:7] == [got[4]] * 3
    assert got[7] != got[6] and len(set(got[7:])) == 1
    assert flowlet.changes == 2
    # A sender that wakes every 1 ms but keeps its NIC busy (each packet leaves the wire
    # 1.2 ms after it was handed over) is never idle: one flowlet. Idle 300 us: a new one.
    busy = Entropy("flowlet", 1, "flow", flowlet_gap_us=200)
    got = []
    for t in range(10):
        got.append(busy.port(t * 1000 * US))
        busy.on_wire_until((t * 1000 + 1200) * US)
    assert len(set(got)) == 1 and busy.changes == 0
    got.append(busy.port((9 * 1000 + 1200 + 300) * US))
    assert got[-1] != got[0] and busy.changes == 1


def test_entropy_is_seeded():
    def seq(seed: int, tag: str, mode: str) -> list[int]:
        e = Entropy(mode, seed, tag)
        return [e.port(i * 1_000_000) for i in range(50)]
    for mode in ("ecmp", "spray", "flowlet"):
        assert seq(1, "a", mode) == seq(1, "a", mode)
    assert seq(1, "a", "spray") != seq(2, "a", "spray") != seq(1, "b", "spray")
    assert Entropy("ecmp", 1, "a").fixed != Entropy("ecmp", 1, "b").fixed
    with pytest.raises(ValueError):
        Entropy("random", 1, "a")


# -- packets and the agent's config, without root ----------------------------------------
ADDR = Addresses("02:00:00:00:00:01", "02:00:00:00:00:02", "198.19.0.1", "198.19.0.2")


def test_parse_bth_of_data_and_sack():
    data = Template.build(Opcode.RC_SEND_MIDDLE, ADDR, dqpn=0x800011, payload_bytes=1000,
                          ackreq=True)
    buf = data.patch(data.buffer(), 77, 50000, 123456789, 42, 77_000)
    got = parse_bth(buf[data.bth:])
    assert (got["opcode"], got["psn"], got["ackreq"], got["dqpn"]) == (
        Opcode.RC_SEND_MIDDLE, 77, True, 0x800011)
    assert (got["ts_ns"], got["msg_id"], got["offset"], got["payload_bytes"]) == (
        123456789, 42, 77_000, 1000)
    ack = Template.build(Opcode.RC_ACK, ADDR, dqpn=5, sack=True)
    buf = ack.patch_ack(ack.buffer(), 9, 50001, Syndrome.ACK, 42, 10, 0b1011)
    got = parse_bth(buf[ack.bth:])
    assert (got["syndrome"], got["msn"], got["sack_base_psn"], got["sack_bitmap"]) == (
        Syndrome.ACK, 42, 10, 0b1011)
    plain = Template.build(Opcode.RC_ACK, ADDR, dqpn=5)
    got = parse_bth(plain.patch_ack(plain.buffer(), 3, 1, Syndrome.NAK_PSN_SEQ_ERROR, 7)
                    [plain.bth:])
    assert got["syndrome"] == Syndrome.NAK_PSN_SEQ_ERROR and "sack_bitmap" not in got
    with pytest.raises(ValueError):
        parse_bth(b"\0" * 8)


def base_config(**over) -> dict:
    cfg = {"node": "a", "loopback": "198.19.0.1", "transport": "roce", "entropy": "ecmp",
           "payload_bytes": 4096, "ports": {"a-eth0": {"src_mac": "02:00:00:00:00:01",
                                                       "dst_mac": "02:00:00:00:00:02"}},
           "routes": {"b": ["a-eth0"]}, "peers": {"b": "198.19.0.2"},
           "steps": [{"sends": [{"src": "a", "dst": "b", "size_bytes": 10, "tag": "t",
                                 "msg_id": 1}], "recvs": []}],
           "results_path": "/nonexistent/r.json"}
    cfg.update(over)
    return cfg


def test_agent_config_checks():
    from traffic.agent_config import AgentConfig, ConfigError
    cfg = AgentConfig.from_dict(base_config(window_packets=32, something_new=1))
    assert cfg.params.window_packets == 32 and cfg.extra == {"something_new": 1}
    assert AgentConfig.from_dict(base_config(rx_delay_ns={"b": 1000})).rx_delay_ns == \
        {"b": 1000}
    bad = [base_config(transport="tcp"), base_config(entropy="random"),
           base_config(routes={"b": ["a-eth9"]}), base_config(peers={}),
           {k: v for k, v in base_config().items() if k != "steps"},
           base_config(steps=[{"sends": [{"src": "a", "dst": "b", "size_bytes": 1,
                                          "tag": "t", "msg_id": 1 << 20}]}]),
           base_config(rx_delay_ns={"b": -1}), base_config(rx_delay_ns={"b": 1.5}),
           base_config(rx_delay_ns={"z": 10})]
    for data in bad:
        with pytest.raises(ConfigError):
            AgentConfig.from_dict(data)


def test_interrupt_moderation_is_frame_times_of_the_fastest_port():
    from traffic.agent_config import AgentConfig, ConfigError
    ports = {"a-eth0": {"src_mac": "02:00:00:00:00:01", "dst_mac": "02:00:00:00:00:02",
                        "rate_mbps": 100.0},
             "a-eth1": {"src_mac": "02:00:00:00:00:03", "dst_mac": "02:00:00:00:00:04",
                        "rate_mbps": 400.0}}
    cfg = AgentConfig.from_dict(base_config(ports=ports))
    frame_bits = (4096 + 14 + 20 + 8 + 12 + 4) * 8        # payload, Ether/IP/UDP/BTH/ICRC
    assert cfg.coalesce_frames == 3.0
    assert cfg.coalesce_ns == int(3 * frame_bits / 400.0 * 1000)      # ~249 us
    cfg = AgentConfig.from_dict(base_config(ports=ports, coalesce_frames=0))
    assert cfg.coalesce_ns == 0
    assert AgentConfig.from_dict(base_config()).coalesce_ns == 0      # no rates: no nap
    with pytest.raises(ConfigError, match="coalesce_frames"):
        AgentConfig.from_dict(base_config(coalesce_frames=-1))


def test_receive_buffer_holds_every_window_at_once():
    from traffic.agent_config import RCVBUF_MIN_BYTES, AgentConfig
    recvs = [{"src": "b", "dst": "a", "size_bytes": 1 << 20, "tag": f"t{i}", "msg_id": i}
             for i in range(1, 41)]
    cfg = AgentConfig.from_dict(base_config(steps=[{"sends": [], "recvs": recvs}],
                                            iterations=2))
    assert cfg.rcvbuf_bytes >= 2 * 40 * 64 * 4096 > RCVBUF_MIN_BYTES
    assert AgentConfig.from_dict(base_config()).rcvbuf_bytes == RCVBUF_MIN_BYTES


def test_socket_drops_are_the_kernels_count():
    """A UDP socket whose buffer overflows: /proc/net/udp's count, read by port."""
    import socket

    from traffic.rx import socket_drops
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        rx.bind(("127.0.0.1", 0))
        port = rx.getsockname()[1]
        assert socket_drops(port) == 0
        for _ in range(200):
            tx.sendto(b"x" * 1000, ("127.0.0.1", port))
        assert socket_drops(port) > 0
    assert socket_drops(port) is None        # closed: no such socket


def test_realtime_offset_matches_the_clocks():
    from traffic.agent_config import realtime_offset_ns
    off = realtime_offset_ns()
    assert abs(time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns() - off) < 1e6


def test_agent_main_reports_a_bad_config(tmp_path: Path):
    from traffic.host import main
    results = tmp_path / "r.json"
    path = tmp_path / "c.json"
    path.write_text(json.dumps(base_config(transport="tcp", results_path=str(results))))
    assert main([str(path)]) == 1
    data = json.loads(results.read_text())
    assert data["ok"] is False and "transport" in data["error"]


# -- on real fabrics (root) ---------------------------------------------------------------
LOSS_TABLE = "aft_loss"
# 2 % of RoCEv2 packets forwarded by the router, data and ACKs counted apart. A constant.
LOSS_RULES = f"""table inet {LOSS_TABLE} {{
  chain loss {{
    type filter hook forward priority 0; policy accept;
    udp dport 4791 udp length > 100 numgen random mod 1000 < 20 counter drop
    udp dport 4791 udp length <= 100 numgen random mod 1000 < 20 counter drop
  }}
}}
"""


def small_leaf_spine(slow_spine_mbps: float | None = None):
    from topologies import leaf_spine
    topo = leaf_spine(leaves=2, spines=2, hosts_per_leaf=1)
    if slow_spine_mbps:     # both links of spine1: that path is slower than spine0's
        for a, b in (("leaf0", "spine1"), ("spine1", "leaf1")):
            topo.graph.edges[a, b]["rate_mbps"] = slow_spine_mbps
    return topo


def p2p(fab, size_bytes: int, **options) -> tuple[dict, dict, dict]:
    """Run one p2p transfer l0h0 -> l1h0; (send flow, recv flow, all results), and
    res["kernel_drops"]: what the kernel dropped meanwhile (see kernel_drops)."""
    from traffic.launch import run_agents
    from traffic.workloads import build_schedule
    sched = build_schedule("p2p", ["l0h0", "l1h0"], size_bytes)
    before = kernel_drops(fab)
    res = run_agents(fab, sched, **options)
    res["kernel_drops"] = kernel_drops(fab) - before
    agents = [r for n, r in res.items() if n != "kernel_drops"]
    assert all(r["ok"] for r in agents), [r["error"] for r in agents]
    (send,) = res["l0h0"]["flows"]
    (recv,) = res["l1h0"]["flows"]
    return send, recv, res


def kernel_drops(fab) -> int:
    """Packets the kernel dropped anywhere a testbed packet goes: every egress queue of
    every node (leaf qdiscs; HTB only sums its children's), every port's rx/tx drops,
    the per-CPU input backlogs, the neighbour queues (a next hop not resolved yet), and
    the UDP receive buffers of every node."""
    total = 0
    for node in fab.topo.graph.nodes:
        with fab.ipr(node) as ipr:
            for q in ipr.get_qdiscs():
                if q.get_attr("TCA_KIND") not in ("htb", "clsact", "ingress"):
                    stats = q.get_attr("TCA_STATS2")
                    total += stats.get_attr("TCA_STATS_QUEUE")["drops"] if stats else 0
            for lk in ipr.get_links():
                s64 = lk.get_attr("IFLA_STATS64")
                total += s64["rx_dropped"] + s64["tx_dropped"]
        proc = fab.popen(node, ["cat", "/proc/net/snmp"], stdout=subprocess.PIPE, text=True)
        udp = [ln.split() for ln in proc.communicate(timeout=10)[0].splitlines()
               if ln.startswith("Udp:")]
        total += int(dict(zip(udp[0], udp[1], strict=True)).get("RcvbufErrors", 0))
    rows = Path("/proc/net/softnet_stat").read_text().splitlines()
    total += sum(int(row.split()[1], 16) for row in rows)
    head, *rows = Path("/proc/net/stat/arp_cache").read_text().splitlines()
    at = head.split().index("unresolved_discards")    # waiting for ARP, queue full
    return total + sum(int(row.split()[at], 16) for row in rows)


def assert_accounted(send: dict, recv: dict, res: dict) -> None:
    """What holds whatever the scheduler does: every byte arrived exactly once, the
    receive socket never overflowed (host-side drops, apart from the fabric's), every
    transmission either arrived or was dropped where the kernel counts it, and nothing
    was resent without a cause (a counted drop, a timeout, or reordering seen by the
    receiver). Without a cause the transfer is clean: no resend, no NAK, no gap."""
    assert recv["exactly_once"] and recv["bytes_delivered"] == recv["size_bytes"]
    assert send["packets"] == send["npackets"] + send["retransmits"]
    assert res["l1h0"]["rx_socket_drops"] == 0 and res["l0h0"]["rx_socket_drops"] == 0
    for r in (res["l0h0"], res["l1h0"]):
        assert r["bad_packets"] == r["unknown_packets"] == 0
    lost = send["packets"] - recv["packets"]
    assert 0 <= lost <= res["kernel_drops"], (lost, res["kernel_drops"])
    if not (res["kernel_drops"] or send["timeouts"] or recv["max_reorder"]
            or send["flowlet_changes"]):
        assert send["retransmits"] == send["naks"] == recv["naks"] == 0, (send, recv)
        assert recv["ooo_packets"] == recv["dup_packets"] == 0, recv


def nft_counters(fab, node: str) -> list[int]:
    proc = fab.popen(node, ["nft", "-j", "list", "table", "inet", LOSS_TABLE])
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    rules = [item["rule"] for item in json.loads(out)["nftables"] if "rule" in item]
    return [next(e["counter"]["packets"] for e in r["expr"] if "counter" in e) for r in rules]


@pytest.mark.root
@pytest.mark.parametrize("transport", ["roce", "uet"])
def test_p2p_transfer_is_exactly_once(fabric, transport):
    """Nothing is lost, so nothing is resent; and if a busy machine did lose or delay
    something, every resend has a cause the kernel or the receiver saw (assert_accounted).
    The RTO is long (250 ms, as in the spray test): a receiver descheduled for 50 ms
    (the default RTO) made the sender time out and resend a window."""
    fab = fabric(small_leaf_spine())
    send, recv, res = p2p(fab, 2_000_000, transport=transport, rto_ms=250)
    assert send["npackets"] == recv["npackets"] == packet_count(2_000_000, 4096) == 489
    assert_accounted(send, recv, res)
    assert (recv["end_ns"] - recv["start_ns"]) / 1e9 > 0.15   # 2 MB at 100 Mbit/s: 0.16 s
    lat = [ns for tag, it, ns in res["l1h0"]["latency_ns"]]
    assert len(lat) == recv["packets"] // 16 and all(0 < ns < 1e9 for ns in lat)
    for r in (res["l0h0"], res["l1h0"]):
        assert r["cpu_s"] > 0 and r["iterations"][0]["end_ns"] > r["iterations"][0]["start_ns"]


@pytest.mark.root
def test_interrupt_moderation_batches_wakeups(fabric):
    """At 100 Mbit/s a 4 KiB frame lasts 332 us: with moderation (3 frame times, ~1 ms)
    the receiver wakes at most about once per 3 frames while data flows (a busy machine
    only makes it wake less); without it, it wakes when a frame comes. Whether the
    transfer takes as long either way depends on the CPU: scripts/bench_moderation.py."""
    fab = fabric(small_leaf_spine())
    out = {}
    for frames in (0, 3):
        send, recv, res = p2p(fab, 4_000_000, coalesce_frames=frames, rto_ms=250)
        assert_accounted(send, recv, res)
        out[frames] = (res["l1h0"]["wakeups_until_done"] / recv["packets"],
                       res["l1h0"]["coalesce_us"])
    assert out[0][1] == 0 and out[3][1] == pytest.approx(3 * 4154 * 8 / 100, abs=1)
    assert 0 < out[3][0] < 0.5, out            # wake-ups per packet, moderated


@pytest.mark.root
def test_latency_is_taken_at_kernel_arrival_not_when_the_agent_reads(fabric, tmp_path):
    """The receiving agent is stopped (SIGSTOP) for 400 ms while a window of packets
    waits in its socket: their one-way latency is the network's (tens of ms at most,
    from the kernel's receive timestamps), not the 400 ms the agent took to read them.
    Every arrival is sampled (a resend carries its own stamp), and the socket, sized
    for every window at once, drops nothing however long the agent is stopped."""
    import threading

    import psutil

    from traffic.launch import agent_configs, launch
    from traffic.workloads import build_schedule
    fab = fabric(small_leaf_spine())
    sched = build_schedule("p2p", ["l0h0", "l1h0"], 2_000_000)
    configs = agent_configs(fab, sched, results_dir=tmp_path)
    for cfg in configs.values():
        cfg.update(rto_ms=2000.0, latency_sample_every=1)   # every packet sampled
    stopped = []

    def stall(start_at_ns: int) -> None:
        def run() -> None:
            recv_cfg = str(tmp_path / "agent-l1h0.config.json")
            (proc,) = [p for p in psutil.process_iter(["cmdline"])
                       if recv_cfg in (p.info["cmdline"] or [])]
            time.sleep(max(0.0, (start_at_ns - time.monotonic_ns()) / 1e9) + 0.05)
            proc.suspend()
            stopped.append(time.monotonic_ns())
            time.sleep(0.4)
            proc.resume()
            stopped.append(time.monotonic_ns())
        threading.Thread(target=run, daemon=True).start()

    before = kernel_drops(fab)
    res = launch(fab, configs, tmp_path, on_start=stall)
    res["kernel_drops"] = kernel_drops(fab) - before
    assert all(r["ok"] for r in (res["l0h0"], res["l1h0"])), res
    assert len(stopped) == 2 and res["l1h0"]["latency_clock"] == "kernel receive timestamp"
    (send,) = res["l0h0"]["flows"]
    (recv,) = res["l1h0"]["flows"]
    assert_accounted(send, recv, res)
    assert (recv["end_ns"] - recv["start_ns"]) / 1e9 > 0.4
    lat_ms = [ns / 1e6 for _, _, ns in res["l1h0"]["latency_ns"]]
    assert len(lat_ms) == recv["packets"] >= 489
    assert min(lat_ms) > 0 and max(lat_ms) < 200, max(lat_ms)   # not the 400 ms stop


@pytest.mark.root
def test_random_drops_go_back_n_and_selective_repeat(fabric):
    fab = fabric(small_leaf_spine())
    proc = fab.popen("leaf0", ["nft", "-f", "-"], stdin=subprocess.PIPE)
    _, err = proc.communicate(LOSS_RULES.encode(), timeout=10)
    assert proc.returncode == 0, err
    seen = {}
    for transport in ("roce", "uet"):
        before = nft_counters(fab, "leaf0")
        send, recv, _ = p2p(fab, 2_000_000, transport=transport, rto_ms=50)
        data_drops, ack_drops = (a - b for a, b in zip(nft_counters(fab, "leaf0"), before,
                                                       strict=True))
        seen[transport] = (data_drops, ack_drops, send, recv)
        assert recv["exactly_once"] and recv["bytes_delivered"] == 2_000_000
    data_drops, _, send, recv = seen["roce"]
    assert data_drops > 0
    assert send["naks"] > 0 and recv["naks"] > 0
    assert send["retransmits"] > data_drops         # go-back-N resends more than was lost
    data_drops, _, send, recv = seen["uet"]
    assert data_drops > 0
    assert send["naks"] == recv["naks"] == 0
    # Each loss is resent (and a resend may be lost again); beyond that, a resend is a
    # duplicate at the receiver, which only a timeout (a stalled receiver) can cause.
    assert data_drops <= send["retransmits"] <= 2 * data_drops + recv["dup_packets"]
    assert recv["dup_packets"] == 0 or send["timeouts"] > 0, (send, recv)


@pytest.mark.root
def test_spraying_over_unequal_spines(fabric):
    """Spine1's links run at 55 Mbit/s, spine0's at 100: a sprayed message arrives out of
    order (the slow path's token bucket runs dry and queues). RC NAKs and goes back N;
    the UET-style transport takes the packets as they come. A long RTO keeps a busy
    machine from firing spurious timeouts."""
    from .conftest import link_counters
    fab = fabric(small_leaf_spine(slow_spine_mbps=55))
    uplinks = {fab.plan.port("leaf0", s).ifname for s in ("spine0", "spine1")}
    out = {}
    for transport in ("roce", "uet"):
        before = link_counters(fab, "leaf0")
        out[transport] = p2p(fab, 2_000_000, transport=transport, entropy="spray",
                             rto_ms=250)
        after = link_counters(fab, "leaf0")
        for ifname in uplinks:    # both spines carried a good share
            assert after[ifname]["tx_packets"] - before[ifname]["tx_packets"] > 150
    send, recv, _ = out["roce"]
    assert recv["exactly_once"] and recv["ooo_packets"] > 0
    assert send["naks"] > 0 and send["retransmits"] > 0
    send, recv, res = out["uet"]
    assert recv["exactly_once"] and recv["ooo_packets"] > 0 and recv["max_reorder"] > 0
    assert send["naks"] == recv["naks"] == 0
    # Reordering shallower than the threshold costs nothing (a busy machine can stall
    # a queue into deeper reordering, or the receiver into a timeout: then a resend is
    # allowed, and must be accounted for).
    if recv["max_reorder"] < 32 and not send["timeouts"] and not res["kernel_drops"]:
        assert send["retransmits"] == recv["dup_packets"] == 0, (send, recv)
    assert send["packets"] - recv["packets"] <= res["kernel_drops"]


@pytest.mark.root
def test_a_flowlet_needs_an_idle_wire_not_an_idle_sender(fabric):
    """An elephant on equal paths keeps its NIC queue full, so its wire is not idle for
    200 us however its sender's wake-ups bunch up (moderation, a full socket): it stays
    one flowlet (a sender idle rule moved it 66 times in 4 MB, every ~15 packets). Only
    a stall longer than its NIC queue (ms: a busy machine) empties the wire and may
    move it, and a move is then the cause of any reordering. Behind slower paths its
    window runs out and the wire does go idle: then it moves."""
    fab = fabric(small_leaf_spine())
    send, recv, res = p2p(fab, 4_000_000, transport="roce", entropy="flowlet", rto_ms=250)
    assert_accounted(send, recv, res)     # no move, no drop: no reordering, no NAK
    assert send["flowlet_changes"] <= send["npackets"] // 50, send
    fab.stop()
    topo = small_leaf_spine()
    for a, b in topo.graph.edges:           # every spine path slower than the NIC
        if "spine" in a + b:
            topo.graph.edges[a, b]["rate_mbps"] = 25.0
    send, recv, res = p2p(fabric(topo), 2_000_000, transport="roce", entropy="flowlet",
                          rto_ms=250)
    assert_accounted(send, recv, res)
    assert send["flowlet_changes"] > 0, send


@pytest.mark.root
@pytest.mark.parametrize("processes", [1, 4])   # all ranks in one process; one each
def test_ring_allreduce_on_four_ranks(fabric, processes):
    from topologies import leaf_spine
    from traffic.launch import run_agents
    from traffic.workloads import build_schedule
    fab = fabric(leaf_spine(leaves=2, spines=2, hosts_per_leaf=2))
    ranks = ["l0h0", "l0h1", "l1h0", "l1h1"]
    size = 1_000_001
    sched = build_schedule("allreduce", ranks, size)
    res = run_agents(fab, sched, transport="uet", entropy="spray", iterations=2,
                     processes=processes)
    assert all(r["ok"] for r in res.values()), {n: r["error"] for n, r in res.items()}
    hosts = {tuple(r["host"]["nodes"]) for r in res.values()}
    assert len(hosts) == processes and sorted(n for h in hosts for n in h) == sorted(ranks)
    for node in ranks:
        r = res[node]
        host = r["host"]      # its process's, shared out evenly over that process's agents
        assert node in host["nodes"] and host["agents"] == 4 // processes
        assert r["cpu_s"] == pytest.approx(host["cpu_s"] / host["agents"], rel=1e-3)
        assert r["cpu_run_s"] <= r["cpu_s"] and host["wakeups"] >= r["wakeups_until_done"]
        recvs = [f for f in r["flows"] if f["role"] == "recv"]
        sends = [f for f in r["flows"] if f["role"] == "send"]
        assert len(recvs) == len(sends) == 2 * 6        # 2(n-1) steps, 2 iterations
        want = sum(t.size_bytes for s in sched[node] for t in s.recvs)
        for it in (0, 1):
            got = [f for f in recvs if f["iteration"] == it]
            assert sum(f["bytes_delivered"] for f in got) == want
            assert all(f["exactly_once"] for f in got)
        (i0, i1) = r["iterations"]
        assert i0["start_ns"] < i0["end_ns"] <= i1["start_ns"] < i1["end_ns"]
        for f in sends:       # a step's send starts once the previous step has arrived
            assert f["end_ns"] > f["start_ns"]
    # 2(n-1)/n * S at 100 Mbit/s is 0.12 s per iteration; allow a busy machine.
    ends = [it["end_ns"] for r in res.values() for it in r["iterations"]]
    starts = [it["start_ns"] for r in res.values() for it in r["iterations"]]
    assert (max(ends) - min(starts)) / 1e9 < 10


@pytest.mark.root
def test_agent_times_out_naming_what_is_missing(fabric, tmp_path: Path):
    from traffic.launch import agent_configs, launch
    from traffic.workloads import build_schedule
    fab = fabric(small_leaf_spine())
    sched = build_schedule("p2p", ["l0h0", "l1h0"], 100_000)
    configs = agent_configs(fab, sched, results_dir=tmp_path)
    configs["l1h0"]["timeout_s"] = 1.0
    t0 = time.monotonic()
    res = launch(fab, {"l1h0": configs["l1h0"]}, tmp_path)   # its sender never starts
    assert time.monotonic() - t0 < 15
    r = res["l1h0"]
    assert r["ok"] is False
    assert r["error"] == "recv p2p.l0h0>l1h0 (iteration 0): 0/25 packets after 1 s"


@pytest.mark.root
def test_agent_ends_cleanly_on_sigterm(fabric, tmp_path: Path):
    from traffic.launch import agent_configs, host_argv
    from traffic.workloads import build_schedule
    fab = fabric(small_leaf_spine())
    sched = build_schedule("p2p", ["l0h0", "l1h0"], 100_000)
    cfg = agent_configs(fab, sched, results_dir=tmp_path)["l1h0"]
    cfg["start_from_stdin"] = True
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    proc = fab.popen("l1h0", host_argv([str(path)]),
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.stdin.write(b"go 0\n")
        proc.stdin.flush()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    r = json.loads(Path(cfg["results_path"]).read_text())
    assert r["ok"] is False and r["error"] == "terminated"
    assert r["flows"][0]["role"] == "recv" and r["flows"][0]["packets"] == 0


def test_senders_time_one_packet_at_a_time_and_never_a_resent_one():
    for cls in (RoceSender, UetSender):
        tx = cls(20, TransportParams(window_packets=8, ack_every=1, rto_ms=5))
        assert [tx.take(100) for _ in range(4)] == [0, 1, 2, 3]    # psn 0 is timed
        tx.on_ack(400, SYNDROME_ACK, 1, 2)                        # 0 and 1 in: 300 ns
        assert (tx.rtt_samples, tx.rtt_sum_ns) == (1, 300)
        tx.take(500)                                              # psn 4: the next timed
        tx.on_timer(100 + 10 * 5 * US * 1000)                     # no progress: RTO
        assert tx.timeouts == 1 and tx.rto_wait_ns == 10 * 5 * US * 1000 - 300
        assert tx.rtt_psn in (-1, 4)
        while (psn := tx.take(60_000_000)) >= 0:                  # resends after the RTO
            assert psn != tx.rtt_psn or psn >= 5
        tx.on_ack(60_000_100, SYNDROME_ACK, 4, 5)
        assert tx.rtt_samples == 1            # psn 4 was resent: its ACK times nothing
