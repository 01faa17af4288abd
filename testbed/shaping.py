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
    """Mbit/s (10^6 bit/s) to bytes/s."""
    return int(rate_mbps * 1_000_000 / 8)


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


def shape(ipr, index: int, rate_mbps: float, queue_bytes: int, mtu: int = MTU_BYTES) -> None:
    """Replace the egress qdisc of interface `index` with the shaped queue above."""
    p = htb_params(rate_mbps, mtu)
    ipr.tc("add", "htb", index=index, handle=HTB_HANDLE, default=0x10)
    ipr.tc("add-class", "htb", index=index, handle=HTB_CLASS, parent=HTB_HANDLE,
           rate=p.rate_bytes_per_s, ceil=p.rate_bytes_per_s, burst=p.burst_bytes,
           cburst=p.burst_bytes, quantum=p.quantum_bytes, mtu=mtu + ETH_HEADER_BYTES)
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
