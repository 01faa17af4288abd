"""Tests for fabric.impair on real fabrics (root): lane failures measured with iperf3,
a laser link failing whole, BER loss measured over 20k UDP packets, a failure schedule
played at its times; the netem branch through a recording fake (this kernel has none).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from pyroute2.netlink.rtnl.ndmsg import NUD_PERMANENT

from fabric import impair, netns
from fabric.impair import Impairments
from fabric.nft_loss import NFT_MOD, nft_script, nft_threshold
from fabric.shaping import configured_rate_mbps
from tests.conftest import link_counters, process, udp_socket_in, wait_for
from topologies import leaf_spine
from topologies.physics import FailureEvent, load_profiles

RATE_MBPS = 100.0
SO_RCVBUFFORCE = 33                 # <asm-generic/socket.h>


def iperf_mbps(fab, client: str, server: str, seconds: int = 3) -> float:
    """TCP goodput over `seconds`, the first second (slow start) omitted (-O 1)."""
    addr = fab.plan.loopback[server]

    def once():
        proc = fab.popen(client, ["iperf3", "-c", addr, "-t", str(seconds), "-O", "1", "-J"])
        out, _ = proc.communicate(timeout=30)
        data = json.loads(out) if out.strip() else {}
        return data if "end" in data and "sum_received" in data["end"] else None

    with process(fab, server, ["iperf3", "-s", "-1", "-B", addr]):
        out = wait_for(once, timeout_s=10, interval_s=0.2)
    assert out, "iperf3 did not run"
    return out["end"]["sum_received"]["bits_per_second"] / 1e6


def port_rate(fab, node: str, peer: str) -> float:
    with fab.ipr(node) as ipr:
        index = ipr.link_lookup(ifname=fab.plan.port(node, peer).ifname)[0]
        return configured_rate_mbps(ipr, index)


def two_hosts(tech: str):
    # l0h0 - leaf0 - l0h1 (in-rack links); the spine hangs off leaf0 unused.
    return leaf_spine(leaves=1, spines=1, hosts_per_leaf=2, rate_mbps=RATE_MBPS, tech=tech)


# -- unit: the rule text and the netem branch (no root) -----------------------------------
def test_nft_script_is_built_only_from_our_numbers_and_names():
    text = nft_script({"leaf0-eth1": 0.01, "leaf0-eth0": 0.0})
    assert f'iifname "leaf0-eth1" numgen random mod {NFT_MOD} < 10000000 counter drop' in text
    assert "leaf0-eth0" not in text          # zero loss: no rule, no hook
    # at the receiving port's ingress, where AF_PACKET-sent frames cannot bypass it
    assert 'table netdev aft_links' in text
    assert 'hook ingress devices = { "leaf0-eth1" }' in text
    assert "postrouting" not in text and "oifname" not in text
    # no loss anywhere: the table is only removed
    assert nft_script({"leaf0-eth0": 0.0}).count("table") == 2
    for bad in ('x"; flush ruleset; "', "eth0", "a" * 14 + "-eth1"):
        with pytest.raises(ValueError):
            nft_script({bad: 0.01})
    for bad in (-0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError):
            nft_threshold(bad)


class FakeIpr:
    def __init__(self, calls):
        self.calls = calls

    def link_lookup(self, ifname):
        return [7]

    def tc(self, *args, **kwargs):
        self.calls.append(("tc", *args, kwargs))

    def link(self, *args, **kwargs):
        self.calls.append(("link", *args, kwargs))


class FakeFabric:
    def __init__(self, topo):
        from fabric.addressing import plan
        self.topo, self.plan, self.calls = topo, plan(topo), []

    def ns(self, node):
        return f"aft-fake.{node}"

    @contextlib.contextmanager
    def ipr(self, node):
        yield FakeIpr(self.calls)


@pytest.mark.parametrize("netem", [True, False])
def test_mechanism_follows_doctor(monkeypatch, netem):
    monkeypatch.setattr(impair.doctor, "has", lambda name: netem if name == "netem" else True)
    assert impair.loss_mechanism() == ("netem" if netem else "nftables")
    monkeypatch.setattr(impair.doctor, "has", lambda name: False)
    assert impair.loss_mechanism() == "none"


def test_netem_branch_delay_and_loss(monkeypatch):
    monkeypatch.setattr(impair.doctor, "has", lambda name: name == "netem")
    monkeypatch.setattr(impair, "run_nft", lambda *a, **k: pytest.fail("nft used with netem"))
    fab = FakeFabric(two_hosts("laser"))
    imp = Impairments(fab).apply(loss_rate=0.01, links=[("l0h0", "leaf0")])
    netems = [c for c in fab.calls if c[1] == "add" and c[2] == "netem"]
    assert len(netems) == 2                  # both directions
    args = netems[0][3]
    # 2 m x 5 ns/m = 10 ns real, x4000 = 40 us emulated; loss in pyroute2's percent
    assert args["delay"] == 40 and args["loss"] == pytest.approx(1.0)
    # the bfifo leaves class 1:10 for netem, then hangs under netem's class 10:1
    assert [c[1] for c in fab.calls[:3]] == ["del", "add", "add"]
    assert fab.calls[2][2] == "bfifo" and fab.calls[2][3]["parent"] == "10:1"
    rec = imp.record()
    assert rec["mechanisms"] == {"rate": rec["mechanisms"]["rate"], "loss": "netem",
                                 "loss_where": impair.LOSS_WHERE["netem"], "delay": "netem"}
    assert rec["not_emulated"] == []
    link = next(x for x in rec["links"] if x["link"] in ("l0h0:leaf0", "leaf0:l0h0"))
    assert link["delay_applied_us"] == {k: 40.0 for k in link["delay_applied_us"]}
    imp.set_loss("l0h0", "leaf0", 0.02)      # already in place: changed, not re-added
    assert sum(1 for c in fab.calls if c[1] == "change" and c[2] == "netem") == 2


def test_without_netem_or_agents_delay_is_recorded_not_emulated(monkeypatch):
    monkeypatch.setattr(impair.doctor, "has", lambda name: name == "nftables")
    scripts = []
    monkeypatch.setattr(impair, "run_nft", lambda ns, args, script=None: scripts.append(
        (ns, script)) or "")
    fab = FakeFabric(two_hosts("laser"))
    imp = Impairments(fab).apply(loss_rate=0.01, links=[("l0h0", "leaf0")])
    assert not [c for c in fab.calls if c[0] == "tc"]
    assert sorted(ns for ns, _ in scripts) == ["aft-fake.l0h0", "aft-fake.leaf0"]
    # each direction dropped at its receiving end: l0h0's rule is on its port to leaf0
    l0h0 = next(s for ns, s in scripts if ns == "aft-fake.l0h0")
    assert f'iifname "{fab.plan.port("l0h0", "leaf0").ifname}"' in l0h0
    rec = imp.record()
    assert rec["mechanisms"]["loss"] == "nftables" and rec["mechanisms"]["delay"] == \
        "not emulated"
    assert "ingress" in rec["mechanisms"]["loss_where"] and "ingress" in imp.loss_where
    assert any("propagation delay not emulated" in r for r in rec["not_emulated"])
    link = next(x for x in rec["links"] if x["link"] in ("l0h0:leaf0", "leaf0:l0h0"))
    assert link["delay_applied_us"] is None and link["delay_emulated_us"] == 40.0
    assert set(link["loss_rate"].values()) == {0.01}


def test_plan_gives_each_events_kernel_operations_and_leaves_the_state():
    fab = FakeFabric(two_hosts("microled"))
    imp = Impairments(fab, mechanism="none")
    a, b = "leaf0", "l0h1"
    steps = imp.plan([FailureEvent(0.5, a, b, "fail_link"),
                      FailureEvent(0.2, a, b, "fail_lane", 7)])
    assert [s["t_s"] for s in steps] == [0.2, 0.5]          # in time order
    # one channel of 200 lost: both ends' HTB rate; then the whole link: both ends down
    assert [(o["op"], o.get("rate_mbps")) for o in steps[0]["ops"]] == \
        [("rate", RATE_MBPS * 199 / 200)] * 2
    assert {o["ns"] for o in steps[0]["ops"]} == {fab.ns(a), fab.ns(b)}
    assert [(o["op"], o["state"]) for o in steps[1]["ops"]] == [("state", "down")] * 2
    # planning changed nothing: no lane failed, nothing down, nothing sent to the kernel
    assert not imp.lanes[imp.key(a, b)].failed and imp.down == set() and fab.calls == []


# -- root: real fabrics ----------------------------------------------------------------
@pytest.mark.root
def test_microled_lane_failures_cost_k_over_n(fabric):
    fab = fabric(two_hosts("microled"))
    profiles = load_profiles(overrides={"profiles": {"microled": {"spare_lanes": 8}}})
    imp = Impairments(fab, profiles, mechanism="none")
    # 100 Mbit/s x 4000 = 400 Gb/s = 200 channels of 2 Gb/s (+ 8 spares)
    assert imp.lanes[imp.key("leaf0", "l0h1")].lanes == 200
    # spares absorb the first 8 failures: nothing changes
    entry = imp.fail_lanes("leaf0", "l0h1", 8)
    assert entry["rate_mbps"] == RATE_MBPS and entry["working_lanes"] == 200
    # 50 more of 200 lanes: 150/200 of nominal, on both ends, read back from the kernel
    entry = imp.fail_lanes("leaf0", "l0h1", 50)
    expected = RATE_MBPS * 150 / 200
    assert entry["rate_mbps"] == expected and entry["working_lanes"] == 150 and \
        entry["lanes"] == 200
    assert port_rate(fab, "leaf0", "l0h1") == pytest.approx(expected, rel=1e-3)
    assert port_rate(fab, "l0h1", "leaf0") == pytest.approx(expected, rel=1e-3)
    measured = iperf_mbps(fab, "l0h0", "l0h1")
    print(f"microled 150/200 lanes: expected {expected} Mbit/s, measured {measured:.1f}")
    assert measured == pytest.approx(expected, rel=0.10)
    imp.remove()
    assert port_rate(fab, "leaf0", "l0h1") == pytest.approx(RATE_MBPS, rel=1e-3)


@pytest.mark.root
def test_laser_link_losing_a_laser_goes_down_and_comes_back(fabric):
    fab = fabric(two_hosts("laser"))
    imp = Impairments(fab, mechanism="none")
    entry = imp.fail_lane("leaf0", "l0h1", 3)
    assert entry["rate_mbps"] == 0 and not entry["up"]

    def oper(node, peer):
        with fab.ipr(node) as ipr:
            (link,) = ipr.get_links(ifname=fab.plan.port(node, peer).ifname)
            return link.get_attr("IFLA_OPERSTATE")

    assert wait_for(lambda: oper("leaf0", "l0h1") == "DOWN" and oper("l0h1", "leaf0") == "DOWN")
    proc = fab.popen("l0h0", ["ping", "-c", "1", "-W", "1", fab.plan.loopback["l0h1"]])
    proc.communicate(timeout=10)
    assert proc.returncode != 0              # nothing gets through a dead laser link
    imp.repair_lane("leaf0", "l0h1", 3)
    assert wait_for(lambda: oper("leaf0", "l0h1") == "UP" and oper("l0h1", "leaf0") == "UP")
    assert port_rate(fab, "leaf0", "l0h1") == pytest.approx(RATE_MBPS, rel=1e-3)

    def ping_ok():
        p = fab.popen("l0h0", ["ping", "-c", "1", "-W", "1", fab.plan.loopback["l0h1"]])
        p.communicate(timeout=10)
        return p.returncode == 0

    assert wait_for(ping_ok, timeout_s=5)    # routes restored on both ends
    for node, peer in (("leaf0", "l0h1"), ("l0h1", "leaf0")):   # and the neighbours
        port = fab.plan.port(node, peer)
        with fab.ipr(node) as ipr:
            index = ipr.link_lookup(ifname=port.ifname)[0]
            assert [(n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR"), n["state"])
                    for n in ipr.get_neighbours(ifindex=index)] == [
                (port.peer_address, port.peer_mac, NUD_PERMANENT)]


@pytest.mark.root
def test_one_percent_loss_measured_over_20k_packets(fabric):
    """Either mechanism (nftables here, netem in the VM): the measured loss is the
    configured 1 %, and every missing packet is one the mechanism counted."""
    fab = fabric(two_hosts("laser"))
    imp = Impairments(fab)
    imp.apply(loss_rate=0.0, links=[("l0h0", "leaf0")])
    imp.set_loss("leaf0", "l0h1", 0.01)      # leaf0 transmits towards l0h1
    sender = udp_socket_in(fab, "l0h0")
    receiver = udp_socket_in(fab, "l0h1")
    port = 5555
    receiver.bind((fab.plan.loopback["l0h1"], port))
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    receiver.setblocking(False)
    sent = 20_000
    before = link_counters(fab, "l0h1")[fab.plan.port("l0h1", "leaf0").ifname]["rx_packets"]
    got = 0
    dst = (fab.plan.loopback["l0h1"], port)
    for i in range(sent):
        sender.sendto(b"x" * 64, dst)
        if i % 200 == 199:                   # drain as we go: no socket-buffer loss
            with contextlib.suppress(BlockingIOError):
                while True:
                    receiver.recv(2048)
                    got += 1
    receiver.settimeout(0.5)
    deadline = time.monotonic() + 2
    with contextlib.suppress(TimeoutError):
        while got < sent and time.monotonic() < deadline:
            receiver.recv(2048)
            got += 1
    sender.close()
    receiver.close()
    after = link_counters(fab, "l0h1")[fab.plan.port("l0h1", "leaf0").ifname]["rx_packets"]
    dropped = imp.link_drops("leaf0", "l0h1")   # nft: at l0h1's port; netem: at leaf0's
    loss = 1 - got / sent
    print(f"1% loss: sent {sent}, received {got} (rx counter +{after - before}), "
          f"{imp.mechanism} dropped {dropped}: measured {loss:.4%}")
    # binomial: sd = sqrt(20000 x 0.01 x 0.99) = 14 packets; +-5 sd = 0.65 % .. 1.35 %
    assert 0.0065 < loss < 0.0135
    assert dropped == sent - got             # every missing packet is one the rule dropped
    assert after - before >= got
    imp.remove()


def raw_udp_frames(fab, src: str, dst: str, count: int, port: int) -> None:
    """Send `count` UDP frames src -> dst the way the agents do: built once with scapy,
    written to an AF_PACKET socket on src's uplink (no IP stack, no netfilter hooks on
    the sender), addressed to the first router's MAC."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    (peer,) = fab.topo.graph.adj[src]
    ifname = fab.plan.port(src, peer).ifname
    with fab.ipr(src) as ipr:
        (mine,) = ipr.get_links(ifname=ifname)
    with fab.ipr(peer) as ipr:
        (theirs,) = ipr.get_links(ifname=fab.plan.port(peer, src).ifname)
    frame = bytes(Ether(src=mine.get_attr("IFLA_ADDRESS"), dst=theirs.get_attr("IFLA_ADDRESS"))
                  / IP(src=fab.plan.loopback[src], dst=fab.plan.loopback[dst], ttl=64)
                  / UDP(sport=40000, dport=port) / (b"x" * 64))
    with netns.entered(fab.ns(src)):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        sock.bind((ifname, 0))
        for _ in range(count):
            sock.send(frame)


@pytest.mark.root
def test_loss_applies_on_every_hop_including_the_host_uplink(fabric):
    """5 % loss on every link of a 4-hop path l0h0 > leaf0 > spine0 > leaf1 > l1h0, frames
    sent through AF_PACKET as the agents send them. Each hop drops ~5 % of what reaches
    it (the host uplink too, which an egress/postrouting rule never saw), and every frame
    the receiver misses is one the mechanism dropped: nftables at each link's receiving
    port here, netem at its sending port in the VM."""
    fab = fabric(leaf_spine(leaves=2, spines=1, hosts_per_leaf=1, rate_mbps=RATE_MBPS))
    imp = Impairments(fab)
    path = ["l0h0", "leaf0", "spine0", "leaf1", "l1h0"]
    hops = list(zip(path[:-1], path[1:], strict=True))
    # every neighbour on the path resolved first: a forwarded frame waiting for ARP can
    # be dropped by the neighbour queue, before it ever reaches the next hop's rule
    ping = fab.popen("l0h0", ["ping", "-c", "3", "-i", "0.2", "-W", "1",
                              fab.plan.loopback["l1h0"]])
    ping.communicate(timeout=20)
    assert ping.returncode == 0
    loss = 0.05
    imp.apply(loss_rate=loss)

    def arrived() -> list[int]:               # rx counter of each hop's receiving port
        return [link_counters(fab, rx)[fab.plan.port(rx, tx).ifname]["rx_packets"]
                for tx, rx in hops]

    receiver = udp_socket_in(fab, "l1h0")
    port = 5556
    receiver.bind((fab.plan.loopback["l1h0"], port))
    # every frame fits the buffer even if the receiver reads only after the sender is
    # done (a slow machine, or the VM's emulated CPU): FORCE passes net.core.rmem_max
    receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    sent = 8000
    before = arrived()
    raw_udp_frames(fab, "l0h0", "l1h0", sent, port)
    got = 0
    receiver.settimeout(0.2)
    deadline = time.monotonic() + 20         # a busy machine may hold frames in a queue
    drops = [0] * len(hops)
    while got + sum(drops) < sent and time.monotonic() < deadline:
        try:
            receiver.recv(2048)
            got += 1
        except TimeoutError:                 # quiet for a moment: where are the rest?
            drops = [imp.link_drops(tx, rx) for tx, rx in hops]
    receiver.close()
    drops = [imp.link_drops(tx, rx) for tx, rx in hops]
    reached = [after - b for after, b in zip(arrived(), before, strict=True)]
    # what each hop's loss saw: nftables drops at the receiving port, after its rx
    # counter; netem at the sending port, so it sees what reached the hop before
    seen = reached if imp.mechanism == "nftables" else [sent, *reached[:-1]]
    lines = [f"{tx}>{rx}: {d} of {n} ({d / max(n, 1):.2%})"
             for (tx, rx), d, n in zip(hops, drops, seen, strict=True)]
    print(f"{loss:.0%} per hop ({imp.mechanism}), {sent} frames sent by AF_PACKET: "
          + "; ".join(lines) + f"; received {got}")
    passed = [n - d for n, d in zip(seen, drops, strict=True)]
    assert seen[0] >= sent                    # all of them reached the first hop's loss
    for k, (dropped, n) in enumerate(zip(drops, seen, strict=True)):
        sd = (n * loss * (1 - loss)) ** 0.5   # binomial over the frames that got there
        assert abs(dropped - n * loss) < 5 * sd, lines
        if k + 1 < len(hops):                 # what passed one hop arrived at the next
            assert abs(seen[k + 1] - passed[k]) <= 3, lines
    assert drops[0] > 0                      # the host uplink drops too
    assert got == sent - sum(drops)          # every missing frame is one a rule dropped
    # the reverse direction has its own rules, at the other ends, untouched by this flow
    assert all(imp.link_drops(rx, tx) == 0 for tx, rx in hops)
    imp.remove()


@pytest.mark.root
def test_netem_delays_every_link_by_its_length(fabric):
    """The netem branch (the VM's kernel; where the kernel has no netem the agents' delay
    line stands in, tested in test_run and test_rx): every port of the fabric gets a
    netem qdisc, and a ping over l0h0 > leaf0 > spine0 > leaf1 > l1h0 takes at least the
    round trip of the links' scaled delays (2 + 30 + 30 + 2 m x 5 ns/m x 4000 = 1.28 ms
    one way), where without them it takes well under a millisecond."""
    fab = fabric(leaf_spine(leaves=2, spines=1, hosts_per_leaf=1, rate_mbps=RATE_MBPS))
    imp = Impairments(fab)
    if imp.delay_mechanism != "netem":
        pytest.skip(f"delay here is the {imp.delay_mechanism}, not netem")
    imp.apply(loss_rate=0.0)
    for a, b in fab.topo.graph.edges():
        for tx, rx in ((a, b), (b, a)):
            with fab.ipr(tx) as ipr:
                index = ipr.link_lookup(ifname=fab.plan.port(tx, rx).ifname)[0]
                kinds = {q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=index)}
            assert "netem" in kinds, (tx, rx, kinds)
    path = ["l0h0", "leaf0", "spine0", "leaf1", "l1h0"]
    one_way_us = sum(imp.delay_for(a, b)[1] for a, b in zip(path[:-1], path[1:], strict=True))
    assert one_way_us == pytest.approx((2 + 30 + 30 + 2) * 5 * 4000 / 1000)
    ping = fab.popen("l0h0", ["ping", "-n", "-q", "-c", "10", "-i", "0.2", "-W", "2",
                              fab.plan.loopback["l1h0"]], stdout=subprocess.PIPE, text=True)
    out, _ = ping.communicate(timeout=30)
    assert ping.returncode == 0, out
    rtt_min_ms = float(out.rsplit("=", 1)[1].split("/")[0])
    print(f"netem: one way {one_way_us / 1000:.2f} ms configured, ping RTT min {rtt_min_ms} ms")
    assert rtt_min_ms >= 2 * one_way_us / 1000
    imp.remove()


class PortTimeline:
    """Polls one port's oper state and HTB rate through its own netlink socket, stamping
    each change on CLOCK_MONOTONIC: what the kernel did, and when, independent of what
    fabric.impair says it did."""

    def __init__(self, fab, node: str, peer: str):
        self.fab, self.node = fab, node
        self.ifname = fab.plan.port(node, peer).ifname
        self.changes: list[tuple[float, str, float]] = []   # (monotonic s, oper, rate)
        self.since: list[float] = []   # per change: when the poll before it began
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = None
        # above the busy processes and the player (-10), so the observer is not late
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -15)
        # opened in this thread: a pyroute2 socket belongs to the thread that uses it
        with self.fab.ipr(self.node) as ipr:
            (index,) = ipr.link_lookup(ifname=self.ifname)
            began = prev = time.monotonic()
            while not self._stop.is_set():
                prev, began = began, time.monotonic()
                (link,) = ipr.get_links(index)
                state = (link.get_attr("IFLA_OPERSTATE"), configured_rate_mbps(ipr, index))
                stamp = time.monotonic()
                self.polls += 1
                if state != last:
                    self.changes.append((stamp, *state))
                    self.since.append(prev)
                    last = state
                time.sleep(0.0005)

    def first(self, after_s: float, pred) -> float | None:
        """The first change at or after `after_s` (monotonic) whose state passes pred."""
        return next((s for s, oper, rate in self.changes
                     if s >= after_s and pred(oper, rate)), None)

    def window(self, at_s: float | None) -> tuple[float, float] | None:
        """When the change seen at `at_s` happened: after the previous poll began (it did
        not show then) and by `at_s`. A poller descheduled between two polls widens the
        window instead of making the kernel look late."""
        if at_s is None:
            return None
        return self.since[[s for s, _, _ in self.changes].index(at_s)], at_s


# Measured on the 2-core CI machine with a busy process per core (and other jobs on
# it): changes reach the port 2-8 ms after their time, the worst seen 21 ms (a repair:
# port up, routes, rates on both ends), once 77 ms in a full-suite run beside a 156-node
# fabric left over by another test. The bound leaves room for that noise; the bugs this
# guards against were 200-370 ms (timed from the wrong start, a thread starved of the
# GIL, events queued behind slow ones).
ON_TIME_S = 0.12


@pytest.mark.root
def test_schedule_events_happen_at_their_times_on_the_port(fabric):
    """Fail a microLED lane at 0.3 s, the whole link at 0.5 s for 1.0 s, repair the lane
    at 1.7 s, all timed from a start 0.2 s in the future (as the launcher's "go" is):
    the port's own state timeline, polled from the kernel, shows each change on time.
    Two busy processes (as many as cores, like the agents) compete for the CPU."""
    fab = fabric(two_hosts("microled"))
    imp = Impairments(fab, mechanism="none")
    lane_rate = RATE_MBPS * 199 / 200          # 400G = 200 channels: one lost = 1/200
    events = [FailureEvent(0.3, "leaf0", "l0h1", "fail_lane", 5),
              FailureEvent(0.5, "leaf0", "l0h1", "fail_link"),
              FailureEvent(1.5, "leaf0", "l0h1", "repair_link"),
              FailureEvent(1.7, "leaf0", "l0h1", "repair_lane", 5)]
    runner = imp.prepare_schedule(events)     # as testbed.run does, before the agents go
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    with contextlib.ExitStack() as stack:
        for proc in busy:
            stack.callback(proc.wait)
            stack.callback(proc.kill)
        tl = stack.enter_context(PortTimeline(fab, "leaf0", "l0h1"))
        assert wait_for(lambda: tl.changes, timeout_s=2)
        start_ns = time.monotonic_ns() + 200_000_000
        t0 = start_ns / 1e9
        runner.start(start_ns)
        runner.join(timeout_s=5)
        time.sleep(0.05)
        stack.close()
    applied = runner.stop()
    assert runner.errors == [] and runner.pending == []
    print("timeline:", [(round(s - t0, 4), o, r) for s, o, r in tl.changes], tl.polls, "polls")
    print("applied:", [(e["action"], e["scheduled_s"], e["began_s"], e["at_s"]) for e in applied])
    degraded = tl.first(t0, lambda oper, rate: rate == pytest.approx(lane_rate, rel=1e-3))
    down = tl.first(t0, lambda oper, rate: oper == "DOWN")
    up = tl.first(down or t0, lambda oper, rate: oper == "UP")
    whole = tl.first(up or t0, lambda oper, rate: oper == "UP" and
                     rate == pytest.approx(RATE_MBPS, rel=1e-3))
    seen = {"fail_lane": degraded, "fail_link": down, "repair_link": up, "repair_lane": whole}
    for ev in events:
        win = tl.window(seen[ev.action])
        assert win is not None, f"{ev.action} never showed on the port"
        after, by = win[0] - t0, win[1] - t0   # the change happened in (after, by]
        assert ev.t_s <= by + 0.001 and after < ev.t_s + ON_TIME_S, (ev, after, by)
    (down_after, down_by), (up_after, up_by) = tl.window(down), tl.window(up)
    assert up_by - down_after > 1.0 - ON_TIME_S and up_after - down_by < 1.0 + ON_TIME_S
    # the log says the same, on the schedule's axis
    assert [e["action"] for e in applied] == [e.action for e in events]
    assert [e["rate_mbps"] for e in applied] == [lane_rate, 0.0, lane_rate, RATE_MBPS]
    for e in applied:
        assert e["scheduled_s"] <= e["began_s"] <= e["at_s"] < e["scheduled_s"] + ON_TIME_S
    print("late at the port (ms):", {ev.action: round((seen[ev.action] - t0 - ev.t_s) * 1e3, 1)
                                     for ev in events})
    imp.remove()


@pytest.mark.root
def test_events_after_the_job_are_recorded_not_dropped(fabric):
    """A repair due after the runner stops (the job ended) is not played, and the record
    says so: the link is still down in it, and the repair is listed as not played."""
    fab = fabric(two_hosts("laser"))
    imp = Impairments(fab, mechanism="none")
    runner = imp.run_schedule([FailureEvent(0.05, "leaf0", "l0h1", "fail_lane", 0),
                               FailureEvent(30.0, "leaf0", "l0h1", "repair_lane", 0)])
    assert wait_for(lambda: runner.applied, timeout_s=2)
    runner.stop()
    rec = imp.record()
    (pending,) = rec["events_not_played"]
    assert pending["action"] == "repair_lane" and pending["scheduled_s"] == 30.0
    assert not pending["played"] and "job ended" in pending["reason"]
    link = next(x for x in rec["links"] if "l0h1" in x["link"])
    assert not link["up"] and link["lanes"] == 4        # 400G laser: 4 lanes of 100G
    imp.remove()


def test_physics_metrics_for_results(monkeypatch):
    monkeypatch.setattr(impair.doctor, "has", lambda name: False)
    fab = FakeFabric(two_hosts("laser"))
    imp = Impairments(fab)
    out = impair.physics_metrics(imp, 8.0, {"job0": 4.0})
    json.dumps(out)                           # JSON-ready
    assert out["link_physics"]["mechanisms"]["loss"] == "none"
    assert len(out["link_physics"]["not_emulated"]) == 2
    # 3 laser links at 100 Mbit/s x 4000 = 400 Gb/s: 4 lit lanes of 3 W = 12 W each
    assert out["link_energy"]["run"]["power_w"] == pytest.approx(36.0)
    assert out["link_energy"]["jobs"]["job0"]["energy_j"] == pytest.approx(36.0 * 4 / 4000)
    assert out["fabric_cost"]["links"]["laser"]["transceivers"] == 6


@pytest.mark.root
def test_lane_failure_limits_both_classes_on_a_pfc_port(fabric):
    """With the lossless layout the link rate sits on class 1:1: a lane failure must
    lower it there, or lossless traffic would keep the nominal rate."""
    from fabric import switch_control
    from fabric.shaping import set_rate
    from topologies import full_mesh
    fab = fabric(full_mesh(nodes=2))
    switch_control.install(fab)
    with fab.ipr("cpu0") as ipr:
        (index,) = ipr.link_lookup(ifname=fab.plan.port("cpu0", "cpu1").ifname)
        set_rate(ipr, index, 75.0)
        rates = {c["handle"]: c.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
                 for c in ipr.get_classes(index=index)}
    parent, lossy, lossless = rates[0x10001], rates[0x10010], rates[0x10013]
    assert parent["rate"] * 8 / 1e6 == pytest.approx(75.0, rel=1e-3)
    assert parent["ceil"] == lossy["ceil"] == lossless["ceil"] == parent["rate"]
    assert lossy["rate"] * 8 / 1e6 == pytest.approx(37.5, rel=1e-3)


# -- propagation delay: the paths' delays and the agents' delay line (no root) ----------
def test_path_delays_follow_the_routes():
    from fabric.routing import compute_routes, path_bottleneck_mbps, path_delay_ns
    topo = leaf_spine(leaves=2, spines=2, hosts_per_leaf=1, rate_mbps=RATE_MBPS)
    fab = FakeFabric(topo)
    fab.routes = compute_routes(topo)
    imp = Impairments(fab, mechanism="none")
    assert imp.delay_mechanism == "agent delay line"
    # host - leaf - spine - leaf - host: 2 + 30 + 30 + 2 m x 5 ns/m x 4000
    assert imp.path_delays_ns([("l0h0", "l1h0")]) == {("l0h0", "l1h0"): 1_280_000}
    assert imp.record()["mechanisms"]["delay"] == "agent delay line"
    assert imp.record()["path_delay_ms"] == {"pairs": 1, "min": 1.28, "mean": 1.28,
                                             "max": 1.28}
    # unequal ECMP paths: the mean weighs each next hop equally
    routes = {"a": {"d": ("b", "c")}, "b": {"d": ("d",)}, "c": {"d": ("d",)}}
    lengths = {("a", "b"): 1, ("b", "d"): 1, ("a", "c"): 5, ("c", "d"): 5}
    assert path_delay_ns(routes, lambda x, y: lengths[x, y], "a", "d") == (6.0, 2.0, 10.0)
    rates = {("a", "b"): 100, ("b", "d"): 25, ("a", "c"): 1800, ("c", "d"): 1800}
    assert path_bottleneck_mbps(routes, lambda x, y: rates[x, y], "a", "d") == \
        (25 + 1800) / 2
    assert Impairments(fab, mechanism="none", delay=False).delay_mechanism == "off"


def test_delay_line_releases_each_datagram_at_arrival_plus_its_senders_delay():
    from traffic.rx import DelayLine
    line = DelayLine({"198.18.0.1": 1000, "198.18.0.2": 300})
    line.hold(b"a", "198.18.0.1", 0)        # due 1000
    line.hold(b"b", "198.18.0.2", 100)      # due 400
    line.hold(b"c", "198.18.0.9", 500)      # unknown sender: not delayed, due 500
    line.hold(b"d", "198.18.0.1", 200)      # due 1200
    assert line.held == 4 and line.next_due() == 400
    assert line.pop(399) is None
    line.hold(b"e", "198.18.0.2", 1500, ce=True)   # due 1800, its CE mark kept
    assert [line.pop(2000) for _ in range(5)] == [
        (400, b"b", False), (500, b"c", False), (1000, b"a", False), (1200, b"d", False),
        (1800, b"e", True)]
    assert line.held == 0 and line.next_due() is None and line.pop(10**9) is None
