"""Virtual output queues: the lossless class split by where each frame is going, held per
destination.

A Linux router is output-queued: what waits, waits in the egress qdisc of the port the
route chose, one FIFO per class. PFC holds that whole FIFO, so a flow toward an idle
receiver waits behind an incast's frames (head-of-line blocking). With `voq = "on"`
every port whose peer forwards (a switch, or a GPU relaying PXN traffic) splits its
lossless class into one queue per destination endpoint its peer can reach through it:

    <port> ── htb 1: ── class 1:1
                          ├─ class 1:12 (the lossless class's share, ETS as before)
                          │    ├─ class 1:100 ── tbf 100:   frames to endpoint d0
                          │    ├─ class 1:101 ── tbf 101:   frames to endpoint d1   ...
                          │    └─ class 1:13  ── tbf 13:    lossless frames to anything else
                          └─ (lossy 1:10, control 1:fe, kick 1:ff as in fabric.lossless)

  classified by u32 on the lossless DSCP and the destination's loopback address; HTB
  serves the backlogged queues round robin (one quantum each). A destination endpoint is
  the fabric's egress port for it (the port its last switch sends it out of), so these
  are the queues a scheduled fabric keeps per fabric egress (Meta's DSF, Broadcom's
  Jericho): finer than a single router's VOQs (one per output port of the next switch),
  which would still put a victim behind an incast at the second hop of a leaf-spine.

The controller (fabric.voq_control) then pauses per destination: when the frames one
ingress port put into a switch's queues for destination d pass XOFF, it sends a VOQ
pause frame naming d (fabric.wire, decoded by fabric/wireshark/aft_voq.lua) and holds
only the upstream's queue for d.

What it does not reproduce: a real VOQ switch keeps the queues in the ingress chip's
shared buffer; here each queue has the port's queue limit of its own, so buffer sharing
between destinations is not modelled, and the queues sit on the upstream's egress (where
a pause holds them) rather than in the next switch's ingress.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric.addressing import plan
from fabric.routing import compute_routes
from topologies.settings import setting
from topologies.spec import SpecError

VOQ_MODES = ("off", "on", "scheduled")
# A port's queues: one HTB class, one tbf and one u32 filter each; a host's port on a
# fabric of n endpoints has n - 1. Beyond this the kernel state and the per-frame u32
# scan grow past what a poll reads in time.
MAX_VOQS_PER_PORT = 64


@dataclass
class VoqSettings:
    """Virtual output queues: the lossless class split per destination, paused per
    destination (needs PFC on), or scheduled by credits from each destination's egress."""

    voq: str = setting(
        "off", "virtual output queues: every port toward a switch keeps one lossless "
        "queue per destination and PFC pauses only the destination that is congested "
        "(on; brings pfc on), or a credit-scheduled fabric: each sender's queue for a "
        "destination sends only at the rate that destination's egress grants it, "
        "sprayed over every spine, with no pause inside the fabric (scheduled; needs "
        "entropy spray; fabric.scheduled)", choices=VOQ_MODES)

    def check_voq(self, where: str, pfc: str, counted_by: list[str]) -> None:
        if self.voq == "off":
            return
        if pfc == "off":
            raise SpecError(f"{where}.voq", f"{self.voq!r} pauses per destination, so it "
                            "needs pfc 'on' (or unset), not 'off'")
        if counted_by:
            raise SpecError(f"{where}.voq", f"{self.voq!r} cannot run with "
                            f"{', '.join(counted_by)} "
                            "yet: they read a port's lossless queue as one FIFO (eBPF "
                            "counters), which the per-destination queues are not")


def port_destinations(topo, routes, ports) -> dict[tuple[str, str], tuple[str, ...]]:
    """(node, ifname) -> the destination endpoints a port's lossless frames can head for
    through its peer, for every port whose peer forwards (`routes`: fabric.routing;
    `ports`: node -> its fabric.addressing.Port list)."""
    g = topo.graph
    endpoints = topo.endpoints()
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for node, node_ports in ports.items():
        for p in node_ports:
            if not g.nodes[p.peer].get("forwards"):
                continue
            dests = tuple(d for d in endpoints if d not in (node, p.peer)
                          and p.peer in routes[node].get(d, ()))
            if dests:
                out[(node, p.ifname)] = dests
    return out


def check_size(topo) -> None:
    """Refuse a topology whose ports would need more than MAX_VOQS_PER_PORT queues."""
    dests = port_destinations(topo, compute_routes(topo), plan(topo).ports)
    most = max((len(d) for d in dests.values()), default=0)
    if most > MAX_VOQS_PER_PORT:
        raise SpecError("experiment.voq", f"VOQs need {most} queues on a port of this "
                        f"topology; at most {MAX_VOQS_PER_PORT} are supported (a fabric "
                        f"of up to {MAX_VOQS_PER_PORT + 1} endpoints)")
