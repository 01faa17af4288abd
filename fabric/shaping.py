"""Link shaping: the one place that speaks tc, through pyroute2, in explicit units.

Each port gets an HTB root (handle 1:) whose default class 1:10 runs at the link rate,
with a byte-limited FIFO (bfifo, handle 10:) as the port's egress queue:

    <port> ── htb 1: ── class 1:10 (rate = ceil = rate_mbps) ── bfifo 10: (queue_bytes)

pyroute2 takes rates as bytes per second and burst as bytes; HTB's quantum is set
explicitly so the kernel does not warn ("quantum of class is big") at any rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo

from topologies import units
from topologies.spec import MTU_BYTES

# pyroute2 ships no bfifo plugin, and without one it would attach bfifo at the root;
# bfifo and pfifo share one option struct (tc_fifo_qopt: limit), in bytes for bfifo.
plugins.setdefault("bfifo", sched_pfifo)

ETH_HEADER_BYTES = 14
HTB_QUANTUM_MAX = 200_000   # the kernel warns above this
HTB_HANDLE = "1:"
HTB_CLASS = "1:10"
QUEUE_HANDLE = "10:"


@dataclass(frozen=True)
class HtbParams:
    rate_bytes_per_s: int
    burst_bytes: int
    quantum_bytes: int


def mbps_to_bytes_per_s(rate_mbps: float) -> int:
    """Mbit/s (10^6 bit/s) to whole bytes/s, as tc takes them."""
    return int(units.mbps_to_bytes_per_s(rate_mbps))


def htb_params(rate_mbps: float, mtu: int = MTU_BYTES) -> HtbParams:
    """HTB class parameters for a rate: quantum and burst fit the rate and the MTU."""
    if rate_mbps <= 0:
        raise ValueError(f"rate_mbps must be > 0, got {rate_mbps}")
    rate = mbps_to_bytes_per_s(rate_mbps)
    frame = mtu + ETH_HEADER_BYTES
    quantum = max(frame, min(HTB_QUANTUM_MAX, rate // 10))
    # At least two full frames; otherwise about 1 ms worth of bytes at the rate.
    burst = max(2 * frame, rate // 1000)
    return HtbParams(rate, burst, quantum)


def htb_class(ipr, verb: str, index: int, handle: str, parent: str, rate_mbps: float,
              ceil_mbps: float | None = None, mtu: int = MTU_BYTES) -> None:
    """Add ("add-class") or change ("change-class") an HTB class: guaranteed `rate_mbps`,
    up to `ceil_mbps` (default: the rate); burst and quantum fit the ceiling."""
    rate = htb_params(rate_mbps, mtu)
    ceil = htb_params(rate_mbps if ceil_mbps is None else ceil_mbps, mtu)
    ipr.tc(verb, "htb", index=index, handle=handle, parent=parent,
           rate=rate.rate_bytes_per_s, ceil=ceil.rate_bytes_per_s, burst=ceil.burst_bytes,
           cburst=ceil.burst_bytes, quantum=ceil.quantum_bytes, mtu=mtu + ETH_HEADER_BYTES)


def shape(ipr, index: int, rate_mbps: float, queue_bytes: int, mtu: int = MTU_BYTES) -> None:
    """Replace the egress qdisc of interface `index` with the shaped queue above."""
    ipr.tc("add", "htb", index=index, handle=HTB_HANDLE, default=0x10)
    htb_class(ipr, "add-class", index, HTB_CLASS, HTB_HANDLE, rate_mbps, mtu=mtu)
    ipr.tc("add", "bfifo", index=index, handle=QUEUE_HANDLE, parent=HTB_CLASS,
           limit=int(queue_bytes))


def queue_stats(ipr, index: int) -> dict:
    """Backlog and drops of the port's egress queue (the bfifo under class 1:10)."""
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") != "bfifo":
            continue
        stats = q.get_attr("TCA_STATS2")
        queue = stats.get_attr("TCA_STATS_QUEUE")
        basic = stats.get_attr("TCA_STATS_BASIC")
        return {"backlog_bytes": queue["backlog"], "drops": queue["drops"],
                "qlen_packets": queue["qlen"], "sent_bytes": basic["bytes"],
                "sent_packets": basic["packets"]}
    raise LookupError(f"no bfifo queue on interface index {index}")


def configured_rate_mbps(ipr, index: int) -> float:
    """The rate the kernel holds for class 1:10 (read back, not what we asked)."""
    for c in ipr.get_classes(index=index):
        if c.get_attr("TCA_KIND") == "htb":
            parms = c.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
            rate64 = c.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64")
            return (rate64 or parms["rate"]) * 8 / 1_000_000
    raise LookupError(f"no htb class on interface index {index}")


# -- link physics (issue 5): rate changes and netem ------------------------------------
NETEM_HANDLE = "10:"          # netem takes the queue's place under class 1:10 ...
NETEM_QUEUE_HANDLE = "20:"    # ... and the port's bfifo moves under netem's class 10:1
NETEM_LIMIT_PACKETS = 10_000  # netem's own delay line, packets (not the port's queue)


def set_rate(ipr, index: int, rate_mbps: float, mtu: int = MTU_BYTES) -> None:
    """Change the port's rate in place; the queues below are kept.

    Plain layout: class 1:10 gets rate = ceil. Lossless (PFC) layout: the link rate is
    on class 1:1, and its lossy and lossless children share it 50/50 up to all of it.
    """
    pfc_parent = 0x10001  # 1:1
    if any(c["handle"] == pfc_parent for c in ipr.get_classes(index=index)):
        lossless_rates(ipr, "change-class", index, rate_mbps, mtu)
    else:
        htb_class(ipr, "change-class", index, HTB_CLASS, HTB_HANDLE, rate_mbps, mtu=mtu)


def netem_args(delay_us: float, loss_rate: float) -> dict:
    """pyroute2's netem units: delay in whole microseconds, loss in percent."""
    if delay_us < 0 or not 0 <= loss_rate <= 1:
        raise ValueError(f"bad netem values: delay_us={delay_us}, loss_rate={loss_rate}")
    return {"delay": int(round(delay_us)), "loss": loss_rate * 100,
            "limit": NETEM_LIMIT_PACKETS}


def add_netem(ipr, index: int, delay_us: float, loss_rate: float, queue_bytes: int) -> None:
    """Put netem (delay, random loss) between class 1:10 and the port's bfifo.

        htb 1: ── class 1:10 ── netem 10: (delay_us, loss_rate) ── bfifo 20: (queue_bytes)
    """
    ipr.tc("del", index=index, handle=QUEUE_HANDLE, parent=HTB_CLASS)
    ipr.tc("add", "netem", index=index, handle=NETEM_HANDLE, parent=HTB_CLASS,
           **netem_args(delay_us, loss_rate))
    ipr.tc("add", "bfifo", index=index, handle=NETEM_QUEUE_HANDLE, parent="10:1",
           limit=int(queue_bytes))


def change_netem(ipr, index: int, delay_us: float, loss_rate: float) -> None:
    """New delay and loss for a netem added by add_netem (its child queue is kept)."""
    ipr.tc("change", "netem", index=index, handle=NETEM_HANDLE, parent=HTB_CLASS,
           **netem_args(delay_us, loss_rate))


# -- lossless layout (PFC; used by testbed.pfc, never by shape()) -------------------------
#
#   <port> ── htb 1: ── class 1:1 (rate = ceil = link)
#                         ├─ class 1:10 (lossy, default) ── bfifo 10: (queue_bytes)
#                         ├─ class 1:13 (lossless: u32 DSCP) ── tbf 13: (open/held) ── bfifo
#                         └─ class 1:ff (kick: skb priority 1:ff only) ── pfifo ff: (limit 0)
#
# The two traffic classes share the link 50/50 and each may borrow all of it (ETS).
# "Holding" the lossless class (a PFC pause at this port) changes tbf 13: to a
# trickle rate; tbf_change refills its bucket, so at most `burst` bytes (one MTU
# frame, the frame "in flight") still leave, and releasing it restores the open rate
# without any token debt. HTB does not reschedule itself on a tc change, so a release
# is followed by one frame sent with skb priority 1:ff: HTB selects that class by
# priority, its zero-length pfifo drops the frame (it never reaches the wire) and the
# enqueue runs the qdisc, which resumes the lossless class.
LOSSLESS_PARENT = "1:1"
LOSSLESS_CLASS = "1:13"
LOSSLESS_HANDLE = "13:"
KICK_CLASS = "1:ff"
KICK_HANDLE = "ff:"
KICK_PRIORITY = 0x000100FF          # skb priority = classid 1:ff
HOLD_RATE_BYTES_PER_S = 4000        # a held class: one 4 KiB frame per second at most
OPEN_RATE_FACTOR = 8                # the open tbf runs far above the link: HTB shapes
TBF_RATE_MAX_BYTES_PER_S = 4_000_000_000   # tbf's rate field is 32 bits
ETH_P_IP = 0x0800


def _tbf_params(rate_mbps: float, queue_bytes: int, held: bool, mtu: int) -> dict:
    frame = mtu + ETH_HEADER_BYTES
    if held:
        return {"rate": HOLD_RATE_BYTES_PER_S, "burst": frame, "limit": int(queue_bytes)}
    rate = min(TBF_RATE_MAX_BYTES_PER_S, OPEN_RATE_FACTOR * mbps_to_bytes_per_s(rate_mbps))
    return {"rate": rate, "burst": max(16 * frame, rate // 100), "limit": int(queue_bytes)}


def lossless_rates(ipr, verb: str, index: int, rate_mbps: float, mtu: int = MTU_BYTES) -> None:
    """Class 1:1 at the link rate; lossy 1:10 and lossless 1:13 guaranteed half each and
    allowed all of it. verb: "add-class" or "change-class"."""
    htb_class(ipr, verb, index, LOSSLESS_PARENT, HTB_HANDLE, rate_mbps, mtu=mtu)
    for handle in (HTB_CLASS, LOSSLESS_CLASS):
        htb_class(ipr, verb, index, handle, LOSSLESS_PARENT, rate_mbps / 2, rate_mbps, mtu)


def shape_lossless(ipr, index: int, rate_mbps: float, queue_bytes: int, dscp: int,
                   lossless_queue_bytes: int | None = None, mtu: int = MTU_BYTES) -> None:
    """Replace the port's egress with the two-class layout above (lossy + lossless).

    Packets whose IPv4 DSCP is `dscp` go to the lossless class; all others to 1:10.
    """
    p = htb_params(rate_mbps, mtu)
    frame = mtu + ETH_HEADER_BYTES
    with _suppress_missing():
        ipr.tc("del", index=index, handle=HTB_HANDLE, parent=0xFFFFFFFF)
    ipr.tc("add", "htb", index=index, handle=HTB_HANDLE, default=0x10)
    lossless_rates(ipr, "add-class", index, rate_mbps, mtu)
    ipr.tc("add-class", "htb", index=index, handle=KICK_CLASS, parent=LOSSLESS_PARENT,
           rate=1000, ceil=p.rate_bytes_per_s, burst=frame, cburst=frame,
           quantum=frame, mtu=frame)
    ipr.tc("add", "bfifo", index=index, handle=QUEUE_HANDLE, parent=HTB_CLASS,
           limit=int(queue_bytes))
    ipr.tc("add", "tbf", index=index, handle=LOSSLESS_HANDLE, parent=LOSSLESS_CLASS,
           **_tbf_params(rate_mbps, lossless_queue_bytes or queue_bytes, False, mtu))
    ipr.tc("add", "pfifo", index=index, handle=KICK_HANDLE, parent=KICK_CLASS, limit=0)
    ipr.tc("add-filter", "u32", index=index, parent=HTB_HANDLE, prio=1, protocol=ETH_P_IP,
           target=LOSSLESS_CLASS, keys=[f"0x{(dscp << 2) << 16:08x}/0x00fc0000+0"])


def hold_lossless(ipr, index: int, rate_mbps: float, queue_bytes: int, held: bool,
                  mtu: int = MTU_BYTES) -> None:
    """Hold (held=True) or release the lossless class of a port in the layout above."""
    ipr.tc("change", "tbf", index=index, handle=LOSSLESS_HANDLE, parent=LOSSLESS_CLASS,
           **_tbf_params(rate_mbps, queue_bytes, held, mtu))


def lossless_stats(ipr) -> dict[int, dict]:
    """Per interface index: the lossless queue (tbf 13:) backlog, drops and bytes sent.

    One qdisc dump for the whole namespace.
    """
    out = {}
    handle = int(LOSSLESS_HANDLE.rstrip(":"), 16) << 16
    for q in ipr.get_qdiscs():
        if q["handle"] != handle or q.get_attr("TCA_KIND") != "tbf":
            continue
        stats = q.get_attr("TCA_STATS2")
        queue = stats.get_attr("TCA_STATS_QUEUE")
        basic = stats.get_attr("TCA_STATS_BASIC")
        out[q["index"]] = {"backlog_bytes": queue["backlog"], "drops": queue["drops"],
                           "sent_bytes": basic["bytes"], "sent_packets": basic["packets"]}
    return out


def _suppress_missing():
    import contextlib

    from pyroute2 import NetlinkError
    return contextlib.suppress(NetlinkError)
