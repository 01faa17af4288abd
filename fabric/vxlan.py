"""VXLAN links: one fabric link carried between two machines over their underlay network.

    node A's port (vxlan, VNI n) ── UDP 4789, DF set ── underlay ── node B's port (vxlan, VNI n)

Each link is a kernel vxlan device of its own (one VNI per link) whose local and remote
addresses are the two machines' underlay addresses; the fabric's port *is* that device, so
every frame, a PFC frame (01:80:C2:00:00:01) included, crosses as it is, with no Linux
bridge in its path (a bridge drops that group address). DF is set on the outer header: a
frame that does not fit the underlay is dropped and counted, never fragmented. The inner
MTU is the underlay's less VXLAN_OVERHEAD_BYTES, capped at the fabric's MTU_BYTES, and
refused below what a full RoCE frame needs (check_underlay_mtu).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from pyroute2 import IPRoute

from fabric import netns
from topologies.spec import MTU_BYTES, SpecError

VXLAN_PORT = 4789                  # IANA
# outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8: what the underlay carries beyond the
# inner frame's IP packet (the inner Ethernet header rides inside the outer UDP payload)
VXLAN_OVERHEAD_BYTES = 50
# the largest RoCEv2 packet the agents send: IPv4 20 + UDP 8 + BTH 12 + RETH 16 + 4096 B
# payload + ICRC 4 (in a 4,170 B Ethernet frame, 4,174 B with its FCS)
ROCE_IP_BYTES = 4156
VNI_MAX = (1 << 24) - 1


def inner_mtu(underlay_mtu: int) -> int:
    """The MTU a VXLAN port gets over an underlay of `underlay_mtu` (capped at the
    fabric's own)."""
    return min(MTU_BYTES, underlay_mtu - VXLAN_OVERHEAD_BYTES)


def check_underlay_mtu(where: str, underlay_mtu: int) -> int:
    """The inner MTU over `underlay_mtu`; SpecError (naming `where`, with the numbers) when
    a full RoCE frame would not fit."""
    inner = inner_mtu(underlay_mtu)
    if inner < ROCE_IP_BYTES:
        raise SpecError(where, f"MTU {underlay_mtu} B carries {inner} B inside VXLAN "
                        f"({VXLAN_OVERHEAD_BYTES} B of outer Ethernet, IP, UDP and VXLAN "
                        f"headers), and a RoCE packet is {ROCE_IP_BYTES} B: set the "
                        f"underlay's MTU to {ROCE_IP_BYTES + VXLAN_OVERHEAD_BYTES} or more "
                        f"({MTU_BYTES + VXLAN_OVERHEAD_BYTES} for the fabric's {MTU_BYTES})")
    return inner


def add_port(ipr, ifname: str, vni: int, local: str, remote: str, underlay_index: int,
             underlay_mtu: int) -> int:
    """Create the VXLAN port `ifname` (VNI `vni`, unicast to `remote`, DF set, the outer
    TOS inherited from the inner packet so the underlay sees the traffic class, learning
    off: the link has one peer) on the underlay interface `underlay_index`; its index."""
    if not 1 <= vni <= VNI_MAX:
        raise ValueError(f"vni must be 1-{VNI_MAX}, got {vni}")
    mtu = check_underlay_mtu(f"underlay of {ifname}", underlay_mtu)
    ipr.link("add", ifname=ifname, kind="vxlan", vxlan_id=vni, vxlan_local=local,
             vxlan_group=remote, vxlan_link=underlay_index, vxlan_port=VXLAN_PORT,
             vxlan_learning=0, vxlan_df=1, vxlan_tos=1, mtu=mtu)
    return ipr.link_lookup(ifname=ifname)[0]


@dataclass(frozen=True)
class CutEnd:
    """This machine's end of a fabric link to another machine: `node` (here) -- `peer`
    (there), VNI `vni`, from `local` to `remote` (underlay addresses) over the underlay
    interface `underlay_index` of MTU `underlay_mtu`."""

    node: str
    peer: str
    vni: int
    local: str
    remote: str
    underlay_index: int
    underlay_mtu: int


# the name a cut port has between its creation on the underlay and its move into its node
STAGING_PREFIX = "aftvx"


def add_cut_port(ipr, end: CutEnd, ifname: str, mac: str, node_pid: int) -> None:
    """Make `end`'s VXLAN port in this namespace (where the underlay is), then move it into
    the namespace of process `node_pid` as `ifname` with address `mac`. Its UDP socket stays
    here, on the underlay; the node sees a port like any other."""
    staging = f"{STAGING_PREFIX}{end.vni}"
    index = add_port(ipr, staging, end.vni, end.local, end.remote, end.underlay_index,
                     end.underlay_mtu)
    try:
        ipr.link("set", index=index, address=mac)
        ipr.link("set", index=index, net_ns_pid=node_pid, ifname=ifname)
    except BaseException:
        with contextlib.suppress(Exception):
            ipr.link("del", index=index)
        raise


# -- two scratch namespaces joined by an underlay and a VXLAN link (benchmark, tests) ---
# Addresses from the top of the fabric's loopback range, which a plan reaches only past
# 65,000 nodes: the underlay's /31, and the VXLAN ports' /31.
UNDERLAY_ADDRESSES = ("198.19.255.0", "198.19.255.1")
INNER_ADDRESSES = ("198.19.255.128", "198.19.255.129")


@contextlib.contextmanager
def scratch_pair(lab: str, underlay_mtu: int = MTU_BYTES + VXLAN_OVERHEAD_BYTES):
    """Namespaces aft-<lab>.a and aft-<lab>.b, a veth underlay `ul-a` -- `ul-b` between
    them (UNDERLAY_ADDRESSES) and a VXLAN link `vx-a` -- `vx-b` over it (VNI 1,
    INNER_ADDRESSES); yields the two namespace names, removes both on the way out."""
    names = (netns.name_of("a", lab), netns.name_of("b", lab))
    made = []
    try:
        for name in names:
            netns.create(name)
            made.append(name)
        peer_fd = os.open(str(netns.RUN_DIR / names[1]), os.O_RDONLY)
        try:
            with netns.entered(names[0]):
                ipr = IPRoute()
            with ipr:
                ipr.link("add", ifname="ul-a", kind="veth", mtu=underlay_mtu,
                         peer={"ifname": "ul-b", "net_ns_fd": peer_fd, "mtu": underlay_mtu})
        finally:
            os.close(peer_fd)
        for i, (name, side) in enumerate(zip(names, "ab", strict=True)):
            with netns.entered(name):
                ipr = IPRoute()
            with ipr:
                ul = ipr.link_lookup(ifname=f"ul-{side}")[0]
                ipr.addr("add", index=ul, address=UNDERLAY_ADDRESSES[i], prefixlen=31)
                ipr.link("set", index=ul, state="up")
                vx = add_port(ipr, f"vx-{side}", 1, UNDERLAY_ADDRESSES[i],
                              UNDERLAY_ADDRESSES[1 - i], ul, underlay_mtu)
                ipr.addr("add", index=vx, address=INNER_ADDRESSES[i], prefixlen=31)
                ipr.link("set", index=vx, state="up")
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        yield names
    finally:
        for name in made:
            netns.remove(name)
