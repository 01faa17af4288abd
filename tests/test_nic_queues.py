"""The NIC's own queues: ACKs, NAKs and CNPs in a class of their own (ack_class "control")
and a send queue per destination (nic_queues "destination"). The settings; and, as root,
an ACK that passes a held lossless class (and, in the data class, waits behind it), a
held destination that holds only its own queue at the NIC (and, with one queue per port,
every destination's), the queues of one egress sharing its wire clock, and a run whose
victim shares its host with an incast sender."""

from __future__ import annotations

import csv
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fabric import lossless
from fabric.lossless import ACK_HANDLE, SwitchSettings
from fabric.shaping import handle_int
from fabric.traffic_class import CONTROL_DSCP, TrafficClass
from testbed.experiment import from_toml
from testbed.run import agent_options
from topologies import full_mesh, leaf_spine
from topologies.spec import SpecError

from .conftest import link_counters, wait_for


# -- settings --------------------------------------------------------------------------
def test_ack_class_needs_a_lossless_class_and_a_dscp_of_its_own():
    with pytest.raises(SpecError, match="experiment.ack_class"):
        from_toml(None, {"name": "x", "ack_class": "control"})
    with pytest.raises(SpecError, match="experiment.dscp: 48 is the ACKs' own DSCP"):
        from_toml(None, {"name": "x", "pfc": "on", "ack_class": "control", "dscp": 48})
    with pytest.raises(SpecError, match="experiment.nic_queues: 'queue' is not one of"):
        from_toml(None, {"name": "x", "nic_queues": "queue"})
    # what brings the lossless class brings it for the ACKs too
    for keys in ({"pfc": "on"}, {"pfc": "off"}, {"voq": "on"}, {"ecn": "on"}):
        exp = from_toml(None, {"name": "x", "ack_class": "control", **keys})
        assert exp.switch_settings().traffic_class.ack_dscp == CONTROL_DSCP
        assert agent_options(exp, 1.0)["ack_dscp"] == CONTROL_DSCP
    plain = from_toml(None, {"name": "x", "pfc": "on"})
    assert plain.switch_settings().traffic_class.ack_dscp is None
    assert agent_options(plain, 1.0)["ack_dscp"] is None
    assert agent_options(plain, 1.0)["nic_queues"] == "port"
    assert SwitchSettings(pfc="on", ack_class="control").ack_dscp == CONTROL_DSCP


def agent_cfg(ports: dict, routes: dict, sends: list[str], recvs: list[str], **kw):
    from traffic.agent_config import AgentConfig
    return AgentConfig(node="a", loopback="198.19.0.1", transport="roce", entropy="ecmp",
                       payload_bytes=4096, ports=ports, routes=routes,
                       peers={p: "198.19.0.9" for p in routes},
                       steps=[{"sends": [{"dst": d} for d in sends],
                               "recvs": [{"src": s} for s in recvs]}],
                       results_path="", **kw)


# -- as root: the kernel's queues ------------------------------------------------------
def ack_frames(addr, n: int, dscp: int) -> list[bytearray]:
    from traffic.packets import Opcode, Template
    t = Template.build(Opcode.RC_ACK, addr, dqpn=1, dscp=dscp)
    return [t.buffer() for _ in range(n)]


@pytest.mark.root
@pytest.mark.parametrize("ack_class", ["control", "data"])
def test_an_ack_passes_a_held_lossless_class_only_in_its_own_class(fabric, ack_class):
    """The host's lossless class is held (a PFC pause) with data queued in it. An ACK on
    the control DSCP leaves at once, from its own socket and its own class (1:11); an
    ACK in the data class waits behind the data, as a NIC FIFO makes it wait."""
    from traffic.launch import addresses_between
    from traffic.packets import DEFAULT_DSCP, Opcode, Template, now_ns
    from traffic.port import Port

    control = ack_class == "control"
    fab = fabric(full_mesh(nodes=2, rate_mbps=100.0))
    lossless.install(fab, TrafficClass(ack_dscp=CONTROL_DSCP if control else None))
    ifname, addr = addresses_between(fab, "cpu0", "cpu1")
    peer_if = fab.plan.port("cpu1", "cpu0").ifname
    edge = fab.topo.graph.edges["cpu0", "cpu1"]
    data = Template.build(Opcode.RC_SEND_MIDDLE, addr, dqpn=1).buffer()    # 4 KiB
    with fab.ipr("cpu0") as ipr:
        (index,) = ipr.link_lookup(ifname=ifname)
        lossless.hold_lossless(ipr, index, edge["rate_mbps"], edge["queue_bytes"], True)
    before = link_counters(fab, "cpu1")[peer_if]["rx_packets"]
    ns = fab.ns("cpu0")
    with Port(ifname, namespace=ns, sndbuf_bytes=16384, rate_mbps=100.0) as wire, \
            Port(ifname, namespace=ns, wire=wire, name=f"{ifname}+acks") as acks:
        for _ in range(32):
            wire.push(data, now_ns())
        for frame in ack_frames(addr, 8, CONTROL_DSCP if control else DEFAULT_DSCP):
            acks.push(frame, now_ns())
        assert acks.frames == 8 and not acks.pending    # its own socket took them all
        if control:
            assert wait_for(lambda: link_counters(fab, "cpu1")[peer_if]["rx_packets"]
                            - before >= 8, 2.0)
        else:
            time.sleep(0.5)
        arrived = link_counters(fab, "cpu1")[peer_if]["rx_packets"] - before
        # a held class lets out its burst (one 9000 B MTU: two 4 KiB frames), then about
        # one frame a second (its trickle) over the 0.5-2 s waited
        assert (8 <= arrived <= 8 + 4) if control else arrived <= 4, arrived
        with fab.ipr("cpu0") as ipr:
            qdiscs = {q["handle"]: q for q in ipr.get_qdiscs(index=index)}
        ack_queue = qdiscs.get(handle_int(ACK_HANDLE))
        if control:
            sent = ack_queue.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["packets"]
            assert sent == 8
        else:
            assert ack_queue is None        # no class of their own
        with fab.ipr("cpu0") as ipr:
            lossless.hold_lossless(ipr, index, edge["rate_mbps"], edge["queue_bytes"],
                                   False)


@pytest.mark.root
@pytest.mark.parametrize("nic_queues", ["destination", "port"])
def test_a_held_destination_holds_only_its_own_queue_at_the_nic(fabric, nic_queues):
    """With VOQ on, a host's port keeps a lossless class per destination; one is held.
    The agent's queues (traffic.port.nic_ports): one per destination lets frames for
    another destination go out at once; one per port keeps them behind the held
    destination's, which filled its socket."""
    from fabric import netns
    from fabric.lossless import tbf_params, voq_class, voq_handle
    from fabric.voq import port_destinations
    from traffic.launch import addresses_between
    from traffic.packets import Opcode, Template, now_ns
    from traffic.port import dest_queue, nic_ports

    fab = fabric(leaf_spine(leaves=1, spines=1, hosts_per_leaf=3))
    lossless.install(fab, TrafficClass(), voq=True)
    ifname, to_held = addresses_between(fab, "l0h0", "l0h1")
    _, to_free = addresses_between(fab, "l0h0", "l0h2")
    dests = port_destinations(fab.topo, fab.routes, fab.plan.ports)[("l0h0", ifname)]
    k = dests.index("l0h1")
    edge = fab.topo.graph.edges["l0h0", "leaf0"]
    with fab.ipr("l0h0") as ipr:
        (index,) = ipr.link_lookup(ifname=ifname)
        ipr.tc("change", "tbf", index=index, handle=voq_handle(k), parent=voq_class(k),
               **tbf_params(edge["rate_mbps"], edge["queue_bytes"], True))
    cfg = agent_cfg({ifname: {"rate_mbps": edge["rate_mbps"]}},
                    {"l0h1": [ifname], "l0h2": [ifname]}, ["l0h1", "l0h2"], [],
                    nic_queues=nic_queues, sndbuf_bytes=65536)
    with netns.entered(fab.ns("l0h0")):
        ports = nic_ports(cfg)
    try:
        held = ports.get(dest_queue(ifname, "l0h1"), ports[ifname])
        free = ports.get(dest_queue(ifname, "l0h2"), ports[ifname])
        assert (held is free) == (nic_queues == "port")
        assert all(p.wire is ports[ifname] for p in ports.values())
        frame = Template.build(Opcode.RC_SEND_MIDDLE, to_held, dqpn=1).buffer()
        for _ in range(64):                 # 256 kB: past the socket's buffer
            held.push(frame, now_ns())
        assert held.blocked and held.pending
        to_l0h2 = fab.plan.port("leaf0", "l0h2").ifname
        before = link_counters(fab, "leaf0")[to_l0h2]["tx_packets"]
        other = Template.build(Opcode.RC_SEND_MIDDLE, to_free, dqpn=2).buffer()
        for _ in range(8):
            free.push(other, now_ns())
        if nic_queues == "destination":
            assert free.frames == 8 and not free.pending
            assert wait_for(lambda: link_counters(fab, "leaf0")[to_l0h2]["tx_packets"]
                            - before >= 8, 2.0)
        else:
            time.sleep(0.3)
            assert len(free.pending) >= 8 + 1       # behind the held destination's
            assert link_counters(fab, "leaf0")[to_l0h2]["tx_packets"] - before == 0
    finally:
        for p in ports.values():
            p.close()


@pytest.mark.root
def test_the_queues_of_one_egress_share_its_wire_clock(fabric):
    """Frames from a second queue of an egress run the wire's clocks (the first Port's):
    its busy time counts once, and the other queue's flowlet clock sees them."""
    from traffic.launch import addresses_between
    from traffic.packets import Opcode, Template, now_ns
    from traffic.port import Port

    fab = fabric(full_mesh(nodes=2, rate_mbps=100.0))
    ifname, addr = addresses_between(fab, "cpu0", "cpu1")
    frame = Template.build(Opcode.RC_SEND_MIDDLE, addr, dqpn=1, payload_bytes=1024).buffer()
    ns = fab.ns("cpu0")
    with Port(ifname, namespace=ns, rate_mbps=100.0) as wire, \
            Port(ifname, namespace=ns, rate_mbps=100.0, wire=wire, name="q1") as q1:
        now = now_ns()
        for _ in range(4):
            q1.push(frame, now)
        wire_ns = 4 * len(frame) * 80      # 80 ns a byte at 100 Mbit/s
        assert q1.frames == 4 and wire.frames == 0
        assert wire.busy_ns == pytest.approx(wire_ns, rel=0.01) and q1.busy_ns == 0
        assert wire.wire_until(0) == q1.wire_until(0) >= now + wire_ns - 4
        assert wire.members == [wire, q1] and wire.queued() >= 0
        assert q1.counters()["frames"] == 4 and q1.name == "q1" and wire.name == ifname


# -- as root: a run ---------------------------------------------------------------------
INCAST = ["l0h0>l1h0", "l0h1>l1h0", "l0h2>l1h0"]
SHARED = "l0h0>l1h1"             # the victim: from a host that also sends into the incast


@pytest.mark.root
def test_a_victim_beside_its_own_hosts_incast_flow_keeps_the_rest_of_its_link(
        host_untouched, tmp_path: Path):
    """VOQ with the NIC's queues per destination and ACKs in their own class: l0h0 sends
    into a 3:1 incast and to an idle receiver. The incast flow drains at B/3; the other
    takes the rest of l0h0's link (fluid: 2B/3), where one NIC FIFO held both to B/3.
    Every byte once, the ACKs on the wire with their own DSCP (tshark)."""
    from testbed.run import run
    host_port = "l0h0-eth0"
    exp = from_toml(None, {
        "name": "nicq", "workload": "p2p", "pairs": [*INCAST, SHARED],
        "message_bytes": 1_000_000, "iterations": 1, "transport": "roce",
        "entropy": "ecmp", "voq": "on", "nic_queues": "destination",
        "ack_class": "control", "window_packets": 512, "pfc_xoff_bytes": 150_000,
        "pfc_xon_bytes": 75_000, "results_dir": str(tmp_path), "timeout_s": 120.0,
        "rto_ms": 200.0, "pcap": [host_port],
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 4, "uplink_rate_mbps": 400.0,
            "queue_bytes": 2 << 20}}})
    folder, m = run(exp, progress=lambda s: None)
    with open(folder / "flows.csv") as fh:
        got = {r["tag"].split(".", 1)[1]: r for r in csv.DictReader(fh) if r["role"] == "recv"}
    assert all(f["exactly_once"] == "True" for f in got.values()), got
    sibling, victim = float(got["l0h0>l1h0"]["goodput_mbps"]), float(got[SHARED]["goodput_mbps"])
    if m["fidelity"]["verdict"] == "faithful":      # rates are the emulator's to keep
        assert victim > 1.4 * sibling, (victim, sibling)
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the ACKs' DSCP is not decoded")
    out = subprocess.run(["tshark", "-r", str(folder / "pcaps" / f"{host_port}.pcap"),
                          "-d", "udp.port==4791,infiniband", "-Y", "infiniband.bth.opcode == 17",
                          "-T", "fields", "-e", "ip.dsfield.dscp"],
                         capture_output=True, text=True, timeout=60, check=True)
    dscps = {int(v) for v in out.stdout.split()}
    assert dscps == {CONTROL_DSCP}, dscps
