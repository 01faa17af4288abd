"""Switch-side load balancing: each switch picks the egress among its equal-cost next
hops by how loaded they are (DLB per flowlet, adaptive routing per packet).

    frame into a switch port ─▶ clsact ingress: cls_bpf "aft_lb<k>" (this module)
        dst IP ─▶ routes (longest prefix, as the kernel's table): the route's next hops,
                  in the kernel's order, each with its egress port's counter slot and
                  a path hash that selects it
        quality of each = queued bytes (in - out - dropped, fabric.queue_counters)
                        + bytes sent in the last few polls (the controller's `load`,
                          raised by every frame this program steers)
        dlb: a flow (its 5-tuple hash) keeps its egress until idle for `gap_ns`
        adaptive: every frame takes the best egress
        ─▶ bpf_set_hash(path hash of the choice) ─▶ the kernel routes it as always

The kernel's own multipath forwarding does the rest (TTL, MAC rewrite, neighbours): with
fib_multipath_hash_policy = 1 it takes a frame's L4 hash, when one is set, as the path
hash (net/ipv4/route.c, fib_multipath_hash: "short-circuit if we already have L4 hash
present"), and hash-threshold selects next hop i for a hash in the i-th of its ranges
(fib_select_multipath, upper bounds from the weights). So the program chooses, and the
choice is visible where it counts: port counters and captures show where frames went.
Ties go to the first best from a start the flow hash (dlb) or a random number (adaptive)
picks, so idle fabrics spread flows as ECMP does. Destinations with one next hop, and
frames that are not IPv4, are left to the kernel.

The program is C (fabric/bpf/switch_lb.bpf.c, compiled at setup, loaded through libbpf
with this switch's `cfg`) and shares the counters' map, so it is loaded by the process
that holds it (the PFC/ECN controller, fabric.switch_control), after the counters: their clsact
is already on every port.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import struct
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from fabric import libbpf, netns
from fabric.queue_counters import CLSACT_INGRESS, QueueCounters
from topologies.settings import setting

SWITCH_LB_MODES = ("ecmp", "dlb", "adaptive")


@dataclass
class SwitchLbSettings:
    """Switch load balancing: the switches' choice among equal-cost next hops"""

    switch_lb: str = setting(
        "ecmp", "ecmp (the kernel's hash), dlb (least loaded per flowlet: a flow idle for "
        "switch_lb_gap_us picks again) or adaptive (least loaded per packet); dlb and "
        "adaptive read the lossless class's queues, so they bring it (unpaused without "
        "pfc on)", choices=SWITCH_LB_MODES)
    switch_lb_gap_us: float = setting(
        1000.0, "dlb: the idle time, us of emulated time, after which a flow picks its "
        "egress again (1 ms is three 4 KiB frame times at 100 Mbit/s)", number=True,
        low=0, low_open=True, high=2e6, high_open=True, metavar="US")


MAX_PATHS = 8
FLOWLET_SLOTS = 4096                  # flow-hash buckets per switch (a power of 2)
ROUTE = struct.Struct("=II" + "II" * MAX_PATHS)     # n, pad, (counter slot, hash) x 8
FLOWLET_BYTES = 16                    # last_ns u64, flow hash u32, choice u32
NAME_PREFIX = "aft_lb"
FILTER_PRIO = 10                      # after the counters' filter (prio 1, ":1")


def path_hashes(weights: list[int]) -> list[int]:
    """The skb hash that makes the kernel pick each next hop: the middle of its range of
    31-bit path hashes (upper bound i = round(2^31 x cumulative weight / total) - 1),
    shifted left once (the kernel uses hash >> 1)."""
    total, cum, lower, out = sum(weights), 0, -1, []
    for w in weights:
        cum += w
        upper = ((cum << 31) + total // 2) // total - 1
        out.append(((lower + 1 + upper) // 2) << 1)
        lower = upper
    return out


class LbConfig(ctypes.Structure):
    """The `cfg` of fabric/bpf/switch_lb.bpf.c, field for field."""

    _fields_ = [("switch_no", ctypes.c_uint32), ("dlb", ctypes.c_uint32),
                ("gap_ns", ctypes.c_uint64), ("ecn_base", ctypes.c_uint32),
                ("load_base", ctypes.c_uint32)]


def lb_config(switch_no: int, mode: str, gap_ns: int, ecn_base: int,
              load_base: int) -> LbConfig:
    """The ingress program's settings for switch number `switch_no` (module docstring)."""
    if mode not in ("dlb", "adaptive"):
        raise ValueError(f"mode must be dlb or adaptive, got {mode!r}")
    if not 0 <= gap_ns < 1 << 31:
        raise ValueError(f"gap_ns must be in [0, 2^31), got {gap_ns}")
    return LbConfig(switch_no=switch_no, dlb=mode == "dlb", gap_ns=gap_ns,
                    ecn_base=ecn_base, load_base=load_base)


@dataclass
class SwitchLb:
    """Attach the programs to every port of `switches` of `fab`, sharing `queues`' map;
    close() closes its maps and programs (the counters' close removes the filters)."""

    fab: object
    queues: QueueCounters
    switches: list[str]
    mode: str
    gap_ns: int
    fds: list[int] = field(default_factory=list)
    routes: int = 0                  # multipath destinations steered

    def attach(self) -> SwitchLb:
        try:
            self._attach()
        except BaseException:
            self.close()
            raise
        return self

    def _attach(self) -> None:
        q = self.queues
        slot_of = {(s.node, s.ifname): s.index for s in q.slots}
        tables = {}
        for sw in self.switches:
            with netns.entered(self.fab.ns(sw)), IPRoute() as ipr:
                names = {lk["index"]: lk.get_attr("IFLA_IFNAME") for lk in ipr.get_links()}
                tables[sw] = (names, list(ipr.get_routes(family=2, table=254)))
        entries = []
        for no, sw in enumerate(self.switches):
            names, routes = tables[sw]
            for r in routes:      # every route: a longer single-path one must win too
                if r.get_attr("RTA_DST") is None:
                    continue
                hops = r.get_attr("RTA_MULTIPATH") or []
                slots = [slot_of.get((sw, names.get(h["oif"]))) for h in hops]
                if len(hops) > MAX_PATHS or None in slots:
                    hops = slots = []       # the kernel's own choice there
                hashes = path_hashes([h["hops"] + 1 for h in hops]) if hops else []
                key = (struct.pack("=II", 32 + r["dst_len"], no)
                       + ipaddress.IPv4Address(r.get_attr("RTA_DST")).packed)
                pairs = [x for pair in zip(slots, hashes, strict=True) for x in pair]
                pairs += [0, 0] * (MAX_PATHS - len(hops))
                entries.append((key, ROUTE.pack(len(hops), 0, *pairs)))
                self.routes += len(hops) > 1
        routes_fd = libbpf.create_map(libbpf.BPF_MAP_TYPE_LPM_TRIE, 12, ROUTE.size,
                                      max(1, len(entries)), libbpf.BPF_F_NO_PREALLOC,
                                      "aft_routes")
        self.fds.append(routes_fd)
        for key, value in entries:
            libbpf.update(routes_fd, key, value)
        flowlet_fd = libbpf.create_map(libbpf.BPF_MAP_TYPE_ARRAY, 4, FLOWLET_BYTES,
                                       FLOWLET_SLOTS * max(1, len(self.switches)), 0,
                                       "aft_flowlets")
        self.fds.append(flowlet_fd)
        maps = {"counters": q.map_fd, "routes": routes_fd, "flowlets": flowlet_fd}
        for no, sw in enumerate(self.switches):
            cfg = lb_config(no, self.mode, self.gap_ns, q.ecn_base, q.load_base)
            fd = libbpf.load_program("switch_lb", "aft_lb", cfg, maps)
            self.fds.append(fd)
            with netns.entered(self.fab.ns(sw)), IPRoute() as ipr:
                for port in self.fab.plan.ports[sw]:
                    index = ipr.link_lookup(ifname=port.ifname)[0]
                    ipr.tc("add-filter", "bpf", index, f":{FILTER_PRIO}", fd=fd,
                           name=f"{NAME_PREFIX}{no}", parent=CLSACT_INGRESS, classid=1,
                           direct_action=True, prio=FILTER_PRIO)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
