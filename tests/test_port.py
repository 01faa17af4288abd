"""Tests for the agent's non-blocking port (traffic.port): with either engine (compiled:
send(2) from C), frames the kernel refuses are kept in order and sent later, and a port
whose link is down loses them and counts them."""

from __future__ import annotations

import json

import pytest

from tests.test_engine import run_python

# A port of cpu0 with a socket buffer of a few frames, 200 frames pushed at once (more
# than the buffer and the shaped link take at once), flushed until none is held; then the
# link down and one more frame pushed on a fresh port.
PROBE = """
import json, sys, time
from pyroute2 import NetNS
from traffic.packets import now_ns
from traffic.port import Port
ns, ifname = sys.argv[1], sys.argv[2]
frame = bytearray(b"\\xff" * 12 + b"\\x88\\xb5" + bytes(986))
out = {}
with Port(ifname, namespace=ns, sndbuf_bytes=4096, rate_mbps=10) as p:
    out["direct"] = p.direct
    for _ in range(200):
        p.push(frame, now_ns())
    out["after_push"] = p.counters()
    deadline = time.monotonic() + 20
    while not p.flush(now_ns()) and time.monotonic() < deadline:
        time.sleep(0.001)
    out["after_flush"] = p.counters()
with NetNS(ns) as ipr:
    ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="down")
with Port(ifname, namespace=ns) as p:
    p.push(frame, now_ns())
    out["down"] = p.counters()
print(json.dumps(out))
"""


@pytest.mark.root
@pytest.mark.parametrize("engine", ["compiled", "interpreted"])
def test_refused_frames_are_kept_in_order_and_a_down_link_loses_them(fabric, engine):
    from topologies import full_mesh
    from traffic.launch import addresses_between

    fab = fabric(full_mesh(nodes=2))
    ifname, _ = addresses_between(fab, "cpu0", "cpu1")
    out = json.loads(run_python(["-c", PROBE, fab.ns("cpu0"), ifname], engine))
    assert out["direct"] is (engine == "compiled")
    pushed = out["after_push"]
    assert pushed["eagain"] + pushed["enobufs"] > 0 and pushed["pending"] > 0
    assert pushed["frames"] + pushed["pending"] == 200 and pushed["down_drops"] == 0
    flushed = out["after_flush"]
    assert (flushed["frames"], flushed["pending"], flushed["down_drops"]) == (200, 0, 0)
    down = out["down"]
    assert (down["frames"], down["pending"], down["down_drops"]) == (0, 0, 1)


@pytest.mark.root
def test_the_time_a_pause_holds_a_full_socket_is_the_networks_not_starvation(fabric):
    """A port whose lossless class is held (a PFC pause) fills its socket: the kernel
    refuses (EAGAIN). The pause lasts 150 ms and the queue drains before the agent
    flushes: none of it is the agent's starvation (a 16-host incast whose pauses held
    its hosts read 78-87 % starved, at 25-31 % CPU, when it was)."""
    import time

    from fabric import lossless
    from topologies import full_mesh
    from traffic.launch import addresses_between
    from traffic.packets import Opcode, Template, now_ns
    from traffic.port import Port

    fab = fabric(full_mesh(nodes=2, rate_mbps=100.0))
    lossless.install(fab)
    ifname, addr = addresses_between(fab, "cpu0", "cpu1")
    edge = fab.topo.graph.edges["cpu0", "cpu1"]
    frame = Template.build(Opcode.RC_SEND_MIDDLE, addr, dqpn=1, payload_bytes=1024).buffer()

    def hold(held: bool) -> None:
        with fab.ipr("cpu0") as ipr:
            (index,) = ipr.link_lookup(ifname=ifname)
            lossless.hold_lossless(ipr, index, edge["rate_mbps"], edge["queue_bytes"], held)

    with Port(ifname, namespace=fab.ns("cpu0"), sndbuf_bytes=4096,
              rate_mbps=edge["rate_mbps"]) as p:
        hold(True)
        for _ in range(64):
            p.push(frame, now_ns())
        assert p.blocked and p.eagain and p.pending
        p.waiting(now_ns())                     # the agent leaves it held
        time.sleep(0.15)
        hold(False)
        deadline = time.monotonic() + 5
        while p.outq() and time.monotonic() < deadline:
            time.sleep(0.005)                   # the kernel sends what it took
        time.sleep(0.05)                        # and the wire stands idle a while
        while not p.flush(now_ns()) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not p.pending and p.frames == 64
        assert p.starved_ns < 5e6, p.starved_ns
