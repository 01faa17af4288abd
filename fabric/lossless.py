"""The lossless class: its settings, its egress layout on every port, its thresholds.

One home for what PFC needs below the traffic layer (fabric.switch_control runs the controller):

- settings: `TrafficClass` (the DSCP the fabric classifies on, the priority PFC frames
  pause), `LosslessSettings` (pfc mode, XOFF/XON/headroom, watchdog, polling) and
  `SwitchSettings`, what the controller runs: PFC with ECN (fabric.queue_counters),
  switch balancing (fabric.switch_lb) and trimming (fabric.trimming), each declared
  where its mechanism is (topologies.settings);
- the egress layout of a port with a lossless class, through pyroute2 (fabric.shaping
  for HTB in explicit units):

    <port> ── htb 1: ── class 1:1 (rate = ceil = link)
                          ├─ class 1:fe (control: skb priority 1:fe, HTB prio 0) ── pfifo fe:
                          ├─ class 1:11 (ACKs: u32 on their DSCP, HTB prio 0) ── pfifo 11:
                          │             (ack_class "control" only)
                          ├─ class 1:10 (lossy, default, prio 1) ── bfifo 10: (queue_bytes)
                          ├─ class 1:13 (lossless: u32 DSCP, prio 1) ── tbf 13: (open/held)
                          └─ class 1:ff (kick: skb priority 1:ff only) ── pfifo ff: (limit 0)

  The two traffic classes share the link 50/50 and each may borrow all of it (ETS).
  The control class carries the PFC frames a port sends and trimmed frames (u32 on
  fabric.trimming's TRIM_DSCP, at every hop): it is guaranteed 1 % of the
  link and served before the data classes (HTB prio 0), so a pause is never queued
  behind data, and it goes through the qdisc like any frame, so a capture on the port
  sees it. With ack_class "control" the ACKs, NAKs and CNPs (their own DSCP) get a class
  beside it, as CNPs get a strict-priority class of their own in DCQCN deployments: HTB
  serves the two prio-0 classes round robin (a quantum each), so a pause waits behind
  few ACKs, and no pause holds the ACKs (a NIC's scheduler sends them between the data
  of its queues). "Holding" the lossless class (a PFC pause received by this port) changes
  tbf 13: to a trickle rate; tbf_change refills its bucket, so at most `burst` bytes
  (one MTU frame, the frame "in flight") still leave, and releasing it restores the
  open rate without any token debt. HTB does not reschedule itself on a tc change, so
  a release is followed by one frame sent with skb priority 1:ff: HTB selects that
  class by priority, its zero-length pfifo drops the frame (it never reaches the wire)
  and the enqueue runs the qdisc, which resumes the lossless class;
- thresholds (pure computations): headroom = link rate x (reaction time + 2 x
  propagation) + the crossing frame + the upstream's release burst + its hold's leak
  (headroom_bytes); XOFF = buffer / fan-in - headroom; XON = XOFF / 2.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum

from pyroute2 import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg

from fabric.qdisc_poller import NLM_F_ACK, NLM_F_REQUEST, RTM_NEWQDISC
from fabric.queue_counters import EcnSettings
from fabric.shaping import (
    ETH_HEADER_BYTES,
    HTB_CLASS,
    HTB_HANDLE,
    QUEUE_HANDLE,
    TC_H_ROOT,
    handle_int,
    htb_class,
    htb_params,
    mbps_to_bytes_per_s,
)
from fabric.switch_lb import SwitchLbSettings
from fabric.traffic_class import (
    ACK_CLASSES,
    CONTROL_DSCP,
    DEFAULT_DSCP,
    DSCP_MAX,
    ROCE_CLASS,
    TrafficClass,
)
from fabric.trimming import TrimSettings
from fabric.voq import VoqSettings, port_destinations
from fabric.wire import TRIM_DSCP
from topologies.physics import ROCE_FRAME_BYTES
from topologies.settings import check_declared, setting
from topologies.spec import MTU_BYTES, SpecError

# -- settings -------------------------------------------------------------------------


# The largest IP packet of the lossless class: only RoCEv2 frames carry its DSCP, and a
# RoCE frame is at most ROCE_FRAME_BYTES (4096 B payload) - Ethernet header - FCS. Headroom
# counts frames of this size in flight, not the 9000-byte link MTU no lossless frame has.
LOSSLESS_MTU_BYTES = ROCE_FRAME_BYTES - ETH_HEADER_BYTES - 4


class PfcMode(StrEnum):
    NONE = ""       # no lossless class: one lossy queue per port (fabric.shaping.shape)
    ON = "on"       # a lossless class, paused by PFC
    OFF = "off"     # the same lossless class, never paused: it overflows and drops


PFC_MODES = tuple(m.value for m in PfcMode)


class WatchdogAction(StrEnum):
    REPORT = "report"   # a pause held longer than watchdog_ms is reported (a storm)
    DROP = "drop"       # ... and the upstream then ignores pauses for watchdog_ms


@dataclass
class LosslessSettings:
    """PFC: the lossless class on every port, paused by PFC (on) or left to drop (off)

    0 bytes: derived from the buffer, the fan-in and the measured reaction time."""

    pfc: str = setting(
        PfcMode.NONE.value, "a lossless class (the DSCP of dscp) on every port, paused by "
        "PFC (on) or left to drop (off); absent: one lossy queue, or the class unpaused "
        "where ecn, switch_lb or trimming needs it", choices=PFC_MODES)
    pfc_xoff_bytes: int = setting(0, "XOFF threshold per ingress port, bytes (0: derived)",
                                  whole=True, low=0, aliases=("--pfc-xoff",),
                                  metavar="BYTES")
    pfc_xon_bytes: int = setting(0, "XON threshold, bytes (0: XOFF / 2)", whole=True, low=0,
                                 aliases=("--pfc-xon",), metavar="BYTES")
    pfc_headroom_bytes: int = setting(
        0, "headroom above XOFF, bytes (0: from the rate, the reaction time, the cable and "
        "the upstream's bursts)", whole=True, low=0, aliases=("--pfc-headroom",), metavar="BYTES")
    pfc_watchdog_ms: float = setting(500.0, "a pause held longer than this, ms, is a storm",
                                     number=True, low=0, low_open=True, metavar="MS")
    pfc_watchdog_action: str = setting(
        WatchdogAction.REPORT.value, "what a pause storm does: it is reported, or pauses "
        "are then ignored on that link and the queue drops",
        choices=tuple(a.value for a in WatchdogAction))
    pfc_poll_ms: float = setting(0.5, "the controller's occupancy read period, ms (netlink: "
                                 "1 ms at least)", number=True, low=0, low_open=True,
                                 metavar="MS")
    dscp: int = setting(DEFAULT_DSCP, "the lossless class's DSCP: the agents mark it, the "
                        "ports classify on it", whole=True, low=0, high=DSCP_MAX)
    ack_class: str = setting(
        "data", "where ACKs, NAKs and CNPs travel: in the lossless class behind data, CNPs "
        f"on DSCP {CONTROL_DSCP} in the lossy one (data), or on DSCP {CONTROL_DSCP} in a "
        "queue of their own on every port, served before data and never paused, from a "
        "socket of their own at the NIC (control; needs the lossless class)",
        choices=ACK_CLASSES)

    def check_lossless(self, where: str) -> None:
        if self.pfc_xoff_bytes and self.pfc_xon_bytes > self.pfc_xoff_bytes:
            raise SpecError(f"{where}.pfc_xon_bytes", f"{self.pfc_xon_bytes} is above "
                            f"pfc_xoff_bytes ({self.pfc_xoff_bytes})")

    @property
    def mode(self) -> PfcMode:
        return PfcMode(self.pfc)

    @property
    def enabled(self) -> bool:
        """PFC pauses upstream ports (mode "on")."""
        return self.mode is PfcMode.ON

    @property
    def traffic_class(self) -> TrafficClass:
        return TrafficClass(dscp=self.dscp, ack_dscp=self.ack_dscp)

    @property
    def ack_dscp(self) -> int | None:
        """The ACKs' own DSCP (ack_class "control"), or None: they ride the data's."""
        return CONTROL_DSCP if self.ack_class == "control" else None


@dataclass
class SwitchSettings(VoqSettings, TrimSettings, SwitchLbSettings, EcnSettings,
                     LosslessSettings):
    """What the switches do with the lossless class's queues (the controller, fabric.switch_control,
    runs them all): PFC, ECN marking, load balancing, trimming. Each is its own switch;
    pfc "" (unset) becomes "off", the class without pauses, when ECN, switch balancing
    or trimming is on: they act on the queues counted in that class."""

    def __post_init__(self) -> None:
        check_declared(self)
        self.check_lossless("experiment")
        self.check_ecn("experiment")
        self.check_trimming("experiment")
        self.check_voq("experiment", self.pfc, self.counted_by)
        if self.mode is PfcMode.NONE and self.voq != "off":
            self.pfc = PfcMode.ON.value
        if self.mode is PfcMode.NONE and self.counted_by:
            self.pfc = PfcMode.OFF.value
        if self.mode is PfcMode.NONE and self.ack_class == "control":
            raise SpecError("experiment.ack_class", "\"control\" gives ACKs a queue of "
                            "their own beside the lossless class's: it needs pfc \"on\" "
                            "or \"off\" (or voq, ecn, switch_lb or trimming on)")
        TrafficClass(dscp=self.dscp, ack_dscp=self.ack_dscp)    # the two DSCPs differ

    @property
    def counted_by(self) -> list[str]:
        """The features on that read the lossless class's counted queues."""
        return [key for key, on in (("ecn", self.ecn == "on"),
                                    ("switch_lb", self.switch_lb != "ecmp"),
                                    ("trimming", self.trimming == "on")) if on]

    @classmethod
    def of(cls, settings) -> SwitchSettings:
        """The switch settings of an experiment (any object with their keys)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def to_keys(self) -> dict[str, object]:
        """The [experiment] keys and values (TOML-ready) of these settings."""
        return asdict(self)


# -- the layout -----------------------------------------------------------------------
LOSSLESS_PARENT = "1:1"
VOQ_PARENT = "1:12"                 # the virtual output queues' parent class (fabric.voq)
VOQ_MINOR_BASE = 0x100              # the k-th queue: class 1:(0x100 + k), tbf (0x100 + k):
LOSSLESS_CLASS = "1:13"
LOSSLESS_HANDLE = "13:"
ACK_CLASS = "1:11"                  # ACKs, NAKs and CNPs with ack_class "control"
ACK_HANDLE = "11:"
ACK_QUEUE_PACKETS = 1000            # 1000 x 78 B: 6 ms at 100 Mbit/s, far past any window's ACKs
CONTROL_CLASS = "1:fe"
CONTROL_HANDLE = "fe:"
CONTROL_PRIORITY = handle_int(CONTROL_CLASS)   # skb priority of the frames a port sends
CONTROL_SHARE = 0.01                # guaranteed to the control class, of the link rate
# PFC frames and trimmed headers (70 B each). HTB lends the control class the link only
# when the data classes leave it tokens, so a 4:1 incast's trims arrive in bursts: 64
# packets overflowed (104 of 777 trimmed frames lost, measured); 1000 lost none. A pause
# waits behind at most 1000 x 70 B (5.6 ms at 100 Mbit/s), and only while trims queue.
CONTROL_QUEUE_PACKETS = 1000
KICK_CLASS = "1:ff"
KICK_HANDLE = "ff:"
KICK_PRIORITY = handle_int(KICK_CLASS)
KICK_ETHERTYPE = 0x88B5             # IEEE local experimental: the frame is dropped by tc
DATA_PRIO, CONTROL_PRIO = 1, 0      # HTB prio: lower is served first
HOLD_RATE_BYTES_PER_S = 4000        # a held class: one 4 KiB frame per second at most
OPEN_RATE_FACTOR = 8                # the open tbf runs far above the link: HTB shapes
TBF_RATE_MAX_BYTES_PER_S = 4_000_000_000   # tbf's rate field is 32 bits
ETH_P_IP = 0x0800


def tbf_params(rate_mbps: float, queue_bytes: int, held: bool, mtu: int = MTU_BYTES) -> dict:
    """tbf 13: held (a trickle, one frame of burst) or open (far above the link)."""
    frame = mtu + ETH_HEADER_BYTES
    if held:
        return {"rate": HOLD_RATE_BYTES_PER_S, "burst": frame, "limit": int(queue_bytes)}
    rate = min(TBF_RATE_MAX_BYTES_PER_S, OPEN_RATE_FACTOR * mbps_to_bytes_per_s(rate_mbps))
    return {"rate": rate, "burst": max(16 * frame, rate // 100), "limit": int(queue_bytes)}


def voq_class(k: int) -> str:
    """The HTB class of a port's k-th virtual output queue (fabric.voq)."""
    return f"1:{VOQ_MINOR_BASE + k:x}"


def voq_handle(k: int) -> str:
    """The handle of the tbf under the k-th virtual output queue's class."""
    return f"{VOQ_MINOR_BASE + k:x}:"


def shape_lossless(ipr, index: int, rate_mbps: float, queue_bytes: int,
                   traffic_class: TrafficClass = ROCE_CLASS,
                   lossless_queue_bytes: int | None = None, mtu: int = MTU_BYTES,
                   voq_dsts: Sequence[str] = ()) -> None:
    """Replace the port's egress with the layout above. IPv4 packets marked
    `traffic_class.dscp` go to the lossless class; all others to the lossy 1:10. With
    `voq_dsts` (IPv4 destinations), the lossless class is split into one queue per
    destination (fabric.voq): class 1:12 shares the class's rate among them by round
    robin, 1:13 (tbf 13:) keeps what goes elsewhere."""
    frame = mtu + ETH_HEADER_BYTES
    lossless_mtu = min(mtu, LOSSLESS_MTU_BYTES)
    with contextlib.suppress(NetlinkError):
        ipr.tc("del", index=index, handle=HTB_HANDLE, parent=TC_H_ROOT)
    ipr.tc("add", "htb", index=index, handle=HTB_HANDLE, default=0x10)
    htb_class(ipr, "add-class", index, LOSSLESS_PARENT, HTB_HANDLE, rate_mbps, mtu=mtu)
    htb_class(ipr, "add-class", index, HTB_CLASS, LOSSLESS_PARENT, rate_mbps / 2, rate_mbps,
              mtu, prio=DATA_PRIO)
    # the lossless class's bucket is sized on its own frames, so what it sends at once
    # after a pause (release_burst_bytes) is two RoCE frames, not two jumbo frames
    parent, share = LOSSLESS_PARENT, rate_mbps / 2
    if voq_dsts:
        htb_class(ipr, "add-class", index, VOQ_PARENT, LOSSLESS_PARENT, share, rate_mbps,
                  lossless_mtu, prio=DATA_PRIO)
        parent, share = VOQ_PARENT, share / (len(voq_dsts) + 1)
    htb_class(ipr, "add-class", index, LOSSLESS_CLASS, parent, share, rate_mbps,
              lossless_mtu, prio=DATA_PRIO)
    htb_class(ipr, "add-class", index, CONTROL_CLASS, LOSSLESS_PARENT,
              rate_mbps * CONTROL_SHARE, rate_mbps, mtu, prio=CONTROL_PRIO)
    ipr.tc("add-class", "htb", index=index, handle=KICK_CLASS, parent=LOSSLESS_PARENT,
           rate=1000, ceil=mbps_to_bytes_per_s(rate_mbps), burst=frame, cburst=frame,
           quantum=frame, mtu=frame)
    ipr.tc("add", "bfifo", index=index, handle=QUEUE_HANDLE, parent=HTB_CLASS,
           limit=int(queue_bytes))
    open_tbf = tbf_params(rate_mbps, lossless_queue_bytes or queue_bytes, False, mtu)
    ipr.tc("add", "tbf", index=index, handle=LOSSLESS_HANDLE, parent=LOSSLESS_CLASS,
           **open_tbf)
    ipr.tc("add", "pfifo", index=index, handle=CONTROL_HANDLE, parent=CONTROL_CLASS,
           limit=CONTROL_QUEUE_PACKETS)
    ipr.tc("add", "pfifo", index=index, handle=KICK_HANDLE, parent=KICK_CLASS, limit=0)
    if traffic_class.ack_dscp is not None:
        htb_class(ipr, "add-class", index, ACK_CLASS, LOSSLESS_PARENT,
                  rate_mbps * CONTROL_SHARE, rate_mbps, mtu, prio=CONTROL_PRIO)
        ipr.tc("add", "pfifo", index=index, handle=ACK_HANDLE, parent=ACK_CLASS,
               limit=ACK_QUEUE_PACKETS)
        ipr.tc("add-filter", "u32", index=index, parent=HTB_HANDLE, prio=1,
               protocol=ETH_P_IP, target=ACK_CLASS,
               keys=[f"0x{(traffic_class.ack_dscp << 2) << 16:08x}/0x00fc0000+0"])
    dscp_key = f"0x{(traffic_class.dscp << 2) << 16:08x}/0x00fc0000+0"
    for k, dst in enumerate(voq_dsts):
        htb_class(ipr, "add-class", index, voq_class(k), VOQ_PARENT, share, rate_mbps,
                  lossless_mtu, prio=DATA_PRIO)
        ipr.tc("add", "tbf", index=index, handle=voq_handle(k), parent=voq_class(k),
               **open_tbf)
        ipr.tc("add-filter", "u32", index=index, parent=HTB_HANDLE, prio=1,
               protocol=ETH_P_IP, target=voq_class(k),
               keys=[dscp_key, f"0x{int(ipaddress.IPv4Address(dst)):08x}/0xffffffff+16"])
    ipr.tc("add-filter", "u32", index=index, parent=HTB_HANDLE, prio=1, protocol=ETH_P_IP,
           target=CONTROL_CLASS, keys=[f"0x{(TRIM_DSCP << 2) << 16:08x}/0x00fc0000+0"])
    ipr.tc("add-filter", "u32", index=index, parent=HTB_HANDLE, prio=2, protocol=ETH_P_IP,
           target=LOSSLESS_CLASS, keys=[dscp_key])


def install(fab, traffic_class: TrafficClass = ROCE_CLASS, voq: bool = False) -> None:
    """Give every port of the fabric `fab` (fabric.core.Fabric; of its nodes on this
    machine, `fab.here`) the layout above; with `voq`, a queue per destination on the
    ports toward a forwarding peer (fabric.voq)."""
    g = fab.topo.graph
    dests = port_destinations(fab.topo, fab.routes, fab.plan.ports) if voq else {}
    for node in fab.here:
        with fab.ipr(node) as ipr:
            for port in fab.plan.ports[node]:
                edge = g.edges[node, port.peer]
                (index,) = ipr.link_lookup(ifname=port.ifname)
                shape_lossless(ipr, index, edge["rate_mbps"], edge["queue_bytes"],
                               traffic_class, voq_dsts=[fab.plan.loopback[d] for d in
                                                        dests.get((node, port.ifname), ())])


def hold_lossless(ipr, index: int, rate_mbps: float, queue_bytes: int, held: bool,
                  mtu: int = MTU_BYTES) -> None:
    """Hold (held=True) or release the lossless class of a port in the layout above."""
    ipr.tc("change", "tbf", index=index, handle=LOSSLESS_HANDLE, parent=LOSSLESS_CLASS,
           **tbf_params(rate_mbps, queue_bytes, held, mtu))


def hold_message(index: int, rate_mbps: float, queue_bytes: int, held: bool,
                 mtu: int = MTU_BYTES, handle: str = LOSSLESS_HANDLE,
                 parent: str = LOSSLESS_CLASS) -> bytes:
    """hold_lossless()'s RTM_NEWQDISC, encoded once by pyroute2 (its tcmsg and tbf
    plugin) for QdiscPoller.request(): sent as bytes it costs ~10 us, not ~1 ms. Another
    `handle` and `parent`: one of a port's virtual output queues (fabric.voq)."""
    return tbf_message(index, tbf_params(rate_mbps, queue_bytes, held, mtu), handle, parent)


def tbf_message(index: int, params: dict, handle: str, parent: str) -> bytes:
    """The RTM_NEWQDISC that sets tbf `handle` (under `parent`) of interface `index` to
    `params` (rate, burst, limit), encoded once (hold_message)."""
    msg = tcmsg()
    msg["index"] = index
    msg["handle"] = handle_int(handle)
    msg["parent"] = handle_int(parent)
    msg["attrs"] = [["TCA_KIND", "tbf"],
                    ["TCA_OPTIONS", plugins["tbf"].get_parameters(dict(params))]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg.encode()
    return bytes(msg.data)


TCA_KIND, TCA_OPTIONS, TCA_TBF_PARMS = 1, 2, 1
TC_LINKLAYER_ETHERNET = 1
PSCHED_TICK_NS = 64                  # tc's time unit (PSCHED_SHIFT 6)
QOPT_RATE_AT, QOPT_BUFFER_AT = 8, 28  # struct tc_tbf_qopt: rate.rate, buffer (ticks)
RTM_HEADER_BYTES = 16 + 20           # nlmsghdr + tcmsg


class TbfRate:
    """A tbf's tc change, encoded once by pyroute2 (~0.4 ms), whose rate is then written
    in place (~2 us): a scheduler that changes rates by the hundred in one poll cannot
    pay the encoding each time. The rate spec says Ethernet, so the kernel never reads
    the rate table pyroute2 encoded for the first rate."""

    def __init__(self, index: int, handle: str, parent: str, burst_bytes: int,
                 limit_bytes: int):
        msg = bytearray(tbf_message(index, {"rate": 1 << 20, "burst": burst_bytes,
                                            "limit": limit_bytes}, handle, parent))
        self.msg, self.burst = msg, burst_bytes
        self.parms = _nested_attr(msg, RTM_HEADER_BYTES, (TCA_OPTIONS, TCA_TBF_PARMS))
        msg[self.parms + 1] = TC_LINKLAYER_ETHERNET

    def message(self, rate_bytes_per_s: int) -> bytes:
        """The change to `rate_bytes_per_s` (at least 1), the burst as encoded."""
        rate = max(1, int(rate_bytes_per_s))
        struct.pack_into("=I", self.msg, self.parms + QOPT_RATE_AT, rate)
        ticks = math.ceil(self.burst * 1e9 / rate / PSCHED_TICK_NS)
        struct.pack_into("=I", self.msg, self.parms + QOPT_BUFFER_AT, min(ticks, 0xFFFFFFFF))
        return bytes(self.msg)


def _nested_attr(msg: bytes | bytearray, off: int, path: tuple[int, ...]) -> int:
    """The offset of the payload of the attribute at `path` (types, outermost first) in
    the netlink attributes that start at `off`."""
    end = len(msg)
    for kind in path:
        while off + 4 <= end:
            length, got = struct.unpack_from("=HH", msg, off)
            if length < 4:
                break
            if got & 0x3FFF == kind:
                off, end = off + 4, off + length
                break
            off += (length + 3) & ~3
        else:
            raise ValueError(f"netlink attribute {kind} not found")
    return off


def kick_frame() -> bytes:
    """The frame that runs a port's qdisc after a release (dropped by pfifo ff:)."""
    return (b"\xff" * 6 + b"\x02\0\0\0\0\x01" + struct.pack("!H", KICK_ETHERTYPE)
            + bytes(46))


def lossless_stats(ipr) -> dict[int, dict]:
    """Per interface index: the lossless queue (tbf 13:) backlog, drops and bytes sent.

    One qdisc dump for the whole namespace.
    """
    out = {}
    handle = handle_int(LOSSLESS_HANDLE)
    for q in ipr.get_qdiscs():
        if q["handle"] != handle or q.get_attr("TCA_KIND") != "tbf":
            continue
        stats = q.get_attr("TCA_STATS2")
        queue = stats.get_attr("TCA_STATS_QUEUE")
        basic = stats.get_attr("TCA_STATS_BASIC")
        out[q["index"]] = {"backlog_bytes": queue["backlog"], "drops": queue["drops"],
                           "sent_bytes": basic["bytes"], "sent_packets": basic["packets"]}
    return out


# -- thresholds -----------------------------------------------------------------------
PROPAGATION_S_PER_M = 5e-9       # light in fibre/copper: ~5 ns per metre


@dataclass(frozen=True)
class Thresholds:
    """Per ingress port, in bytes of lossless occupancy charged to that port."""

    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    ok: bool = True          # XOFF + headroom of every ingress fits the buffer
    note: str = ""
    # the reaction (XOFF crossing to the upstream held) its headroom covers, ms: the one
    # it was derived for, or what a given headroom covers at the port's rate
    covers_ms: float = field(default=math.inf, compare=False)


def release_burst_bytes(rate_mbps: float) -> int:
    """What a port's lossless class sends back to back, faster than its rate, once a
    pause ends: the bucket of its HTB class (shape_lossless), full after any pause."""
    return htb_params(rate_mbps, LOSSLESS_MTU_BYTES).burst_bytes if rate_mbps > 0 else 0


def hold_leak_bytes(mtu: int = MTU_BYTES) -> int:
    """What still leaves a port after its lossless class is held: tbf refills its bucket
    on every change, and the held bucket passes one frame of the link's MTU."""
    return tbf_params(1.0, 0, True, mtu)["burst"]


def headroom_bytes(rate_mbps: float, reaction_s: float, mtu: int = MTU_BYTES,
                   length_m: float = 0.0) -> int:
    """Bytes that may still arrive at an ingress after its occupancy crossed XOFF: the
    link rate over the reaction and the cable's round trip, the frame that crossed, the
    upstream's release burst (it may have just been let go) and what its hold lets out
    (a frame of `mtu`, the lossless frames' size, crosses; the link's MTU leaks)."""
    in_flight = rate_mbps * 1e6 / 8 * (reaction_s + 2 * length_m * PROPAGATION_S_PER_M)
    return math.ceil(in_flight) + bursts_bytes(rate_mbps, mtu)


def bursts_bytes(rate_mbps: float, mtu: int = MTU_BYTES) -> int:
    """The part of the headroom no reaction time shrinks: the crossing frame, the
    release burst and the hold's leak (headroom_bytes)."""
    return mtu + ETH_HEADER_BYTES + release_burst_bytes(rate_mbps) + hold_leak_bytes()


def thresholds_for(buffer_bytes: int, fan_in: int, rate_mbps: float, reaction_s: float,
                   mtu: int = MTU_BYTES, length_m: float = 0.0, xoff_bytes: int = 0,
                   xon_bytes: int = 0, headroom: int = 0) -> Thresholds:
    """XOFF/XON/headroom for one ingress port of a switch with `fan_in` ingress ports
    that may all feed one egress buffer of `buffer_bytes` (0 = derived, as in LosslessSettings).

    Derived XOFF = buffer / fan_in - headroom (all ingress ports at XOFF plus their
    headroom fill the buffer exactly); XON = XOFF / 2. Given values are kept; `ok` is
    False (with a note saying what would fit) when fan_in x (XOFF + headroom) > buffer.
    """
    frame = mtu + ETH_HEADER_BYTES
    fan_in = max(1, fan_in)
    room = headroom or headroom_bytes(rate_mbps, reaction_s, mtu, length_m)
    xoff = xoff_bytes or buffer_bytes // fan_in - room
    note = ""
    ok = xoff >= frame and fan_in * (xoff + room) <= buffer_bytes
    if not ok:
        need = fan_in * (max(xoff, frame) + room)
        note = (f"buffer {buffer_bytes} B cannot hold {fan_in} x (XOFF {max(xoff, frame)} B"
                f" + headroom {room} B for {reaction_s * 1e3:.2f} ms at {rate_mbps:g} Mbit/s)"
                f": drops are possible; needs >= {need} B")
        xoff = max(xoff, frame)
    xon = xon_bytes or xoff // 2
    if not 0 <= xon <= xoff:
        raise ValueError(f"XON ({xon} B) must be between 0 and XOFF ({xoff} B)")
    covers_s = ((room - bursts_bytes(rate_mbps, mtu)) * 8 / (rate_mbps * 1e6)
                - 2 * length_m * PROPAGATION_S_PER_M) if rate_mbps > 0 else math.inf
    return Thresholds(int(xoff), int(xon), int(room), ok, note, max(0.0, covers_s) * 1e3)
