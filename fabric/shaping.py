"""Link shaping: the one place that speaks tc, through pyroute2, in explicit units.

Each port gets an HTB root (handle 1:) whose default class 1:10 runs at the link rate,
with a byte-limited FIFO (bfifo, handle 10:) as the port's egress queue:

    <port> ── htb 1: ── class 1:10 (rate = ceil = rate_mbps) ── bfifo 10: (queue_bytes)

pyroute2 takes rates as bytes per second and burst as bytes; HTB's quantum is set
explicitly so the kernel does not warn ("quantum of class is big") at any rate.
fabric.lossless builds a port with a lossless class from the same HTB classes; set_rate
changes the link rate of either layout, each class keeping its share of the link.

`AFT_PORT_LAYOUT=plain` (read by `port_layout`) builds the fabric's ports with no qdisc
at all: the veths and routers as plain Mininet without TCLink has them, links as fast as
the CPU moves frames. It exists to measure the kernel's floor (scripts/profile_packet.py
--layout plain, docs/kernel_cost.md): such a run emulates no link rate, no queue and no
lossless class, and refuses what needs them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo

from fabric.environ import environ
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
TC_H_ROOT = 0xFFFFFFFF      # the parent of a root qdisc and of HTB's top-level classes
PORT_LAYOUT_ENV = "AFT_PORT_LAYOUT"
SHAPED, PLAIN = "shaped", "plain"
PORT_LAYOUTS = (SHAPED, PLAIN)


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


def burst_s(rate_mbps: float, mtu: int = MTU_BYTES) -> float:
    """How long a port's burst lasts at its rate: a shaping timer that fires later than
    this after it was due costs the port wire time (fabric.shaping_timers)."""
    p = htb_params(rate_mbps, mtu)
    return p.burst_bytes / p.rate_bytes_per_s


def port_layout() -> str:
    """The ports' layout AFT_PORT_LAYOUT asks for (default: shaped); ValueError if unknown."""
    name = os.environ.get(PORT_LAYOUT_ENV, "") or SHAPED
    if name not in PORT_LAYOUTS:
        raise ValueError(f"{PORT_LAYOUT_ENV}={name!r}: expected one of "
                         f"{', '.join(PORT_LAYOUTS)}")
    return name


def layout_env(name: str):
    """AFT_PORT_LAYOUT set to `name` inside the block (a context; the fabric's forked
    workers inherit it), restored after."""
    if name not in PORT_LAYOUTS:
        raise ValueError(f"port layout {name!r}: expected one of {', '.join(PORT_LAYOUTS)}")
    return environ(PORT_LAYOUT_ENV, name)


def handle_int(handle: str) -> int:
    """A tc handle or class id as the kernel holds it: "13:" -> 0x130000, "1:fe" -> 0x100fe."""
    major, _, minor = handle.partition(":")
    return int(major, 16) << 16 | int(minor or "0", 16)


def htb_class(ipr, verb: str, index: int, handle: str, parent: str, rate_mbps: float,
              ceil_mbps: float | None = None, mtu: int = MTU_BYTES, prio: int = 0) -> None:
    """Add ("add-class") or change ("change-class") an HTB class: guaranteed `rate_mbps`,
    up to `ceil_mbps` (default: the rate); burst and quantum fit the ceiling. Classes of
    lower `prio` are served first."""
    rate = htb_params(rate_mbps, mtu)
    ceil = htb_params(rate_mbps if ceil_mbps is None else ceil_mbps, mtu)
    ipr.tc(verb, "htb", index=index, handle=handle, parent=parent,
           rate=rate.rate_bytes_per_s, ceil=ceil.rate_bytes_per_s, burst=ceil.burst_bytes,
           cburst=ceil.burst_bytes, quantum=ceil.quantum_bytes, mtu=mtu + ETH_HEADER_BYTES,
           prio=prio)


def shape(ipr, index: int, rate_mbps: float, queue_bytes: int, mtu: int = MTU_BYTES) -> None:
    """Replace the egress qdisc of interface `index` with the shaped queue above."""
    ipr.tc("add", "htb", index=index, handle=HTB_HANDLE, default=0x10)
    htb_class(ipr, "add-class", index, HTB_CLASS, HTB_HANDLE, rate_mbps, mtu=mtu)
    ipr.tc("add", "bfifo", index=index, handle=QUEUE_HANDLE, parent=HTB_CLASS,
           limit=int(queue_bytes))


def queue_stats(ipr, index: int, kind: str = "bfifo") -> dict:
    """Backlog and drops of the port's egress queue (the bfifo under class 1:10), or of
    its qdisc of another `kind` (netem: the frames its loss dropped)."""
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") != kind:
            continue
        stats = q.get_attr("TCA_STATS2")
        queue = stats.get_attr("TCA_STATS_QUEUE")
        basic = stats.get_attr("TCA_STATS_BASIC")
        return {"backlog_bytes": queue["backlog"], "drops": queue["drops"],
                "qlen_packets": queue["qlen"], "sent_bytes": basic["bytes"],
                "sent_packets": basic["packets"]}
    raise LookupError(f"no {kind} qdisc on interface index {index}")


def configured_rate_mbps(ipr, index: int) -> float:
    """The rate the kernel holds for class 1:10 (read back, not what we asked)."""
    for c in ipr.get_classes(index=index):
        if c.get_attr("TCA_KIND") == "htb":
            parms = c.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
            rate64 = c.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64")
            return (rate64 or parms["rate"]) * 8 / 1_000_000
    raise LookupError(f"no htb class on interface index {index}")


# -- link physics: rate changes and netem ---------------------------------------------
NETEM_HANDLE = "10:"          # netem takes the queue's place under class 1:10 ...
NETEM_QUEUE_HANDLE = "20:"    # ... and the port's bfifo moves under netem's class 10:1
NETEM_LIMIT_PACKETS = 10_000  # netem's own delay line, packets (not the port's queue)


def set_rate(ipr, index: int, rate_mbps: float, mtu: int = MTU_BYTES) -> None:
    """Change the port's link rate in place; the queues below are kept.

    The link rate is the rate of the HTB class under the root (1:10 in the layout above,
    1:1 in fabric.lossless's); every class keeps its rate and ceiling as shares of it,
    and its prio, whichever layout the port was built with.
    """
    classes = {c["handle"]: (c["parent"], *_htb_rates(c)) for c in ipr.get_classes(index=index)
               if c.get_attr("TCA_KIND") == "htb"}
    roots = [h for h, (parent, *_) in classes.items() if parent == TC_H_ROOT]
    if len(roots) != 1:
        raise LookupError(f"interface index {index}: {len(roots)} HTB classes under the "
                          "root, not one link class")
    link = classes[roots[0]][1]
    for handle, (parent, rate, ceil, prio) in sorted(classes.items()):
        htb_class(ipr, "change-class", index, _handle_str(handle),
                  HTB_HANDLE if parent == TC_H_ROOT else _handle_str(parent),
                  rate_mbps * rate / link, rate_mbps * ceil / link, mtu, prio)


def _htb_rates(cls) -> tuple[int, int, int]:
    """(rate, ceil) in bytes/s and prio of an HTB class as the kernel holds it."""
    parms = cls.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
    rate = cls.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64") or parms["rate"]
    ceil = cls.get_nested("TCA_OPTIONS", "TCA_HTB_CEIL64") or parms["ceil"]
    return rate, ceil, parms["prio"]


def _handle_str(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


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
