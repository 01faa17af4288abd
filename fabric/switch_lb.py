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

Each program is hand-assembled eBPF (fabric.queue_counters' assembler, no compiler at
run time) and shares the counters' map, so it is loaded by the process that holds it
(the PFC/ECN controller, testbed.pfc), after the counters: their clsact is already on
every port.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import struct
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from fabric import netns
from fabric.queue_counters import (
    BPF_FUNC_GET_PRANDOM_U32,
    BPF_MAP_TYPE_ARRAY,
    CLSACT_INGRESS,
    SKB_LEN,
    TC_ACT_UNSPEC,
    QueueCounters,
    _Asm,
    _bpf,
    load_program,
    new_map,
)
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
BPF_MAP_TYPE_LPM_TRIE, BPF_F_NO_PREALLOC = 11, 1
BPF_MAP_UPDATE_ELEM = 2
BPF_FUNC_KTIME_GET_NS, BPF_FUNC_GET_HASH_RECALC, BPF_FUNC_SET_HASH = 5, 34, 48
ROUTE = struct.Struct("=II" + "II" * MAX_PATHS)     # n, pad, (counter slot, hash) x 8
FLOWLET_BYTES = 16                    # last_ns u64, flow hash u32, choice u32
NAME_PREFIX = "aft_lb"
FILTER_PRIO = 10                      # after the counters' filter (prio 1, ":1")
# stack slots (fp offsets; KEY is where _Asm.lookup puts its key)
KEY, ETH, RKEY, NOW, BEST_Q, BEST_I, START, SLOT, CAND, TOTAL = (
    -4, -16, -32, -40, -48, -56, -64, -72, -80, -88)


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


def _update(map_fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", map_fd, 0, ctypes.addressof(k),
                                          ctypes.addressof(v), 0))


def program(routes_fd: int, counters_fd: int, flowlet_fd: int, switch_no: int, mode: str,
            gap_ns: int, ecn_base: int, load_base: int) -> bytes:
    """The ingress program of one switch's ports (module docstring). Registers: r6 the
    skb, r7 the route, r8 the flow hash and r9 its flowlet bucket (dlb); the rest on the
    stack, since every helper call clobbers r0-r5."""
    if mode not in ("dlb", "adaptive"):
        raise ValueError(f"mode must be dlb or adaptive, got {mode!r}")
    if not 0 <= gap_ns < 1 << 31:
        raise ValueError(f"gap_ns must be in [0, 2^31), got {gap_ns}")
    a = _Asm()
    a.op(0xBF, 6, 1)                                # r6 = skb
    a.load_bytes(12, ETH, 4)                        # a runt: the kernel's
    a.op(0x69, 4, 10, ETH)
    a.jump(0x55, "out", 4, 0x0008)                  # not IPv4: the kernel's choice
    a.load_bytes(30, RKEY + 8, 4)                   # the IPv4 destination
    a.op(0x62, 10, 0, RKEY, 64)                     # longest prefix of (switch, dst)
    a.op(0x62, 10, 0, RKEY + 4, switch_no)
    a.lookup_at(routes_fd, RKEY)                    # no route: the kernel's
    a.op(0x61, 1, 0, 0)
    a.jump(0xB5, "out", 1, 1)                       # one next hop: the kernel's
    a.op(0xBF, 7, 0)                                # r7 = route
    a.op(0x85, imm=BPF_FUNC_KTIME_GET_NS)
    a.op(0x7B, 10, 0, NOW)
    if mode == "dlb":
        a.op(0xBF, 1, 6)
        a.op(0x85, imm=BPF_FUNC_GET_HASH_RECALC)
        a.op(0xBF, 8, 0)                            # r8 = the flow's 5-tuple hash
        a.op(0xBF, 1, 8)
        a.op(0x57, 1, imm=FLOWLET_SLOTS - 1)
        a.op(0x07, 1, imm=switch_no * FLOWLET_SLOTS)
        a.lookup(flowlet_fd, key_reg=1)
        a.op(0xBF, 9, 0)                            # r9 = the flow's bucket
        a.op(0x61, 1, 9, 8)
        a.jump(0x5D, "pick", 1, src=8)              # another flow's bucket: pick
        a.op(0x79, 1, 9, 0)
        a.op(0x79, 2, 10, NOW)
        a.op(0x1F, 2, 1)                            # idle = now - last
        a.jump(0x25, "pick", 2, gap_ns)             # idle > gap: a new flowlet
        a.op(0x61, 1, 9, 12)                        # else its egress stays
        a.op(0x7B, 10, 1, BEST_I)
        a.jump(0x05, "chosen")
        a.label("pick")
        a.op(0xBF, 0, 8)                            # start at hash % n
    else:
        a.op(0x85, imm=BPF_FUNC_GET_PRANDOM_U32)    # start at random % n
    a.op(0x61, 1, 7, 0)                             # n
    a.jump(0x15, "out", 1, 0)
    a.op(0x9F, 0, 1)                                # r0 %= n
    a.op(0x7B, 10, 0, START)
    a.op(0x7A, 10, 0, BEST_I, 0)
    a.op(0x18, 1, 0, 0, -1)
    a.op(0, imm=0x7FFFFFFF)
    a.op(0x7B, 10, 1, BEST_Q)                       # best = the largest s64
    for j in range(MAX_PATHS):
        a.op(0x61, 1, 7, 0)                         # n
        a.jump(0xB5, "chosen", 1, j)                # if n <= j: all seen
        a.op(0x79, 2, 10, START)
        a.op(0x07, 2, imm=j)                        # idx = start + j
        a.jump(0xAD, f"in{j}", 2, src=1)            # if idx < n ...
        a.op(0x1F, 2, 1)                            # ... else idx -= n
        a.label(f"in{j}")
        a.jump(0x25, "out", 2, MAX_PATHS - 1)       # a bound the verifier can see
        a.op(0x7B, 10, 2, CAND)
        a.op(0x67, 2, imm=3)
        a.op(0x0F, 2, 7)
        a.op(0x61, 3, 2, 8)                         # its counter slot
        a.op(0x7B, 10, 3, SLOT)
        # quality = in - out - dropped + load: four entries of the counters' map
        for k, (shift, add, sign) in enumerate(((1, 0, 1), (1, 1, -1), (0, ecn_base, -1),
                                                (0, load_base, 1))):
            a.op(0x79, 1, 10, SLOT)
            if shift:
                a.op(0x67, 1, imm=1)                # 2 x slot (+ 1): bytes in, out
            if add:
                a.op(0x07, 1, imm=add)
            a.lookup(counters_fd, key_reg=1)
            a.op(0x79, 1, 0, 0)
            if k == 0:
                a.op(0x7B, 10, 1, TOTAL)
            else:
                a.op(0x79, 2, 10, TOTAL)
                a.op(0x0F if sign > 0 else 0x1F, 2, 1)
                a.op(0x7B, 10, 2, TOTAL)
        a.op(0x79, 1, 10, TOTAL)
        a.op(0x79, 2, 10, BEST_Q)
        a.jump(0xCD, f"better{j}", 1, src=2)        # if quality s< best: take it
        a.jump(0x05, f"next{j}")
        a.label(f"better{j}")
        a.op(0x7B, 10, 1, BEST_Q)
        a.op(0x79, 1, 10, CAND)
        a.op(0x7B, 10, 1, BEST_I)
        a.label(f"next{j}")
    a.label("chosen")
    a.op(0x79, 1, 10, BEST_I)
    a.jump(0x25, "out", 1, MAX_PATHS - 1)
    if mode == "dlb":
        a.op(0x79, 2, 10, NOW)
        a.op(0x7B, 9, 2, 0)                         # the bucket: last_ns = now,
        a.op(0x63, 9, 8, 8)                         # its flow,
        a.op(0x63, 9, 1, 12)                        # its egress
    a.op(0x67, 1, imm=3)
    a.op(0x0F, 1, 7)                                # r1 = route + 8 x choice
    a.op(0x61, 2, 1, 12)                            # its path hash
    a.op(0x61, 3, 1, 8)                             # its counter slot
    a.op(0x7B, 10, 3, SLOT)
    a.op(0xBF, 1, 6)
    a.op(0x85, imm=BPF_FUNC_SET_HASH)               # the kernel takes that path
    a.op(0x79, 1, 10, SLOT)                         # its load += this frame, at once
    a.op(0x07, 1, imm=load_base)
    a.lookup(counters_fd, key_reg=1)
    a.op(0x61, 1, 6, SKB_LEN)
    a.op(0xDB, 0, 1, 0, 0)
    a.op(0xB7, 1, imm=1)
    a.op(0xDB, 0, 1, 8, 0)                          # frames steered there
    a.label("out")
    a.op(0xB7, 0, imm=TC_ACT_UNSPEC)
    a.op(0x95)
    return a.assemble()


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
        routes_fd = new_map(BPF_MAP_TYPE_LPM_TRIE, 12, ROUTE.size, max(1, len(entries)),
                         BPF_F_NO_PREALLOC)
        self.fds.append(routes_fd)
        for key, value in entries:
            _update(routes_fd, key, value)
        flowlet_fd = new_map(BPF_MAP_TYPE_ARRAY, 4, FLOWLET_BYTES,
                          FLOWLET_SLOTS * max(1, len(self.switches)))
        self.fds.append(flowlet_fd)
        for no, sw in enumerate(self.switches):
            fd = load_program(program(routes_fd, q.map_fd, flowlet_fd, no, self.mode,
                                      self.gap_ns, q.ecn_base, q.load_base),
                              f"{NAME_PREFIX}{no}")
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
