"""Lossless-class queue occupancy counted in the kernel: tc clsact eBPF byte counters.

    switch port p (egress)                      its peer's port (ingress)
      clsact egress: cls_bpf "aft_q<2p>"  ──▶  clsact ingress: cls_bpf "aft_q<2p+1>"
      runs before the qdisc enqueues           runs when the frame arrived, after the
                                               qdisc sent it
      adds len, 1 to entry 2p, and to the      adds len, 1 to entry 2p+1
      entry of the port the frame came in by

in one BPF array map (BPF_F_MMAPABLE) that the PFC controller maps into its memory:
bytes into the port's queue minus bytes out of it = its occupancy, read with no system
call at all (a netlink dump of a switch costs ~60 us; 16 switches take a whole 1 ms
poll). The per-ingress entries say who put the bytes in (skb->ingress_ifindex), which a
switch needs to pause the right upstream (fabric.switch_occupancy). Only IPv4 frames of the
lossless DSCP count, so lossy traffic and PFC frames do not. What this cannot see:
frames the qdisc dropped (they went in and never came out); the controller reconciles
with the qdisc's own backlog.

ECN marking (`Ecn`, DCQCN's RED profile) rides on the same counts: the egress program
of a marking port computes the queue's occupancy as the frame enters it (bytes in - out
- dropped, the last written into the map by the controller, which alone can see the
qdisc's drops) and, above kmin with probability pmax (q - kmin) / (kmax - kmin), at or
above kmax always, sets CE with bpf_skb_ecn_set_ce (a frame that is not ECT is left as
it is), counting each mark in the map.

Trimming (`Trim`, fabric.trimming) reads the same occupancy: at a port that trims, a UET
data frame that would pass the threshold is cut to its headers, re-marked and counted
as trimmed instead of into the queue.

The program is C (fabric/bpf/queue.bpf.c, compiled by clang at setup), loaded per hook
with its `cfg` set (`hook_config`, `load_hook`) through libbpf (fabric.libbpf) and
attached through pyroute2. Where the kernel refuses (no BPF, no clsact) or the object
is not built, `attach` raises CountersUnavailableError with the reason and the
controller polls netlink.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import mmap
import os
import struct
from dataclasses import dataclass

from pyroute2 import IPRoute

from fabric import libbpf, netns
from fabric.queue_wake import RING_BYTES, Waker
from fabric.trimming import Trim
from fabric.voq import MAX_VOQS_PER_PORT
from fabric.wire import COUNT
from topologies.settings import setting
from topologies.spec import SpecError

PROB_ONE = 1 << 16                    # marking probabilities in 1/65536ths
CLSACT_INGRESS, CLSACT_EGRESS = "ffff:fff2", "ffff:fff3"
VALUE = COUNT                         # one entry: bytes, frames (struct count)
NAME_PREFIX = "aft_q"
MAX_PORTS = 128                       # a switch's ports attribution names (queue.bpf.c)
MAX_DSTS = MAX_VOQS_PER_PORT          # a port's virtual output queues (queue.bpf.c)


@dataclass(frozen=True)
class Ecn:
    """RED-style CE marking of a queue: none up to `kmin_bytes`, then with probability
    rising linearly to `pmax` at `kmax_bytes`, every ECT frame from there on."""

    kmin_bytes: int
    kmax_bytes: int
    pmax: float

    def __post_init__(self) -> None:
        if not 0 <= self.kmin_bytes < self.kmax_bytes < 1 << 31:
            raise ValueError(f"ECN needs 0 <= kmin < kmax < 2^31 bytes, got "
                             f"{self.kmin_bytes}, {self.kmax_bytes}")
        if not 0 < self.pmax <= 1:
            raise ValueError(f"ECN pmax must be in (0, 1], got {self.pmax}")


ECN_MODES = ("off", "on")


@dataclass
class EcnSettings:
    """ECN: switches mark CE on the lossless class (a RED profile)"""

    # HPCC's ns-3 defaults keep kmax = 4 kmin (100/400 KB at 100 Gb/s) and pmax 0.2; the
    # emulated queue is 128 KiB, so they sit at 4 and 16 RoCE frames: kmin 16 KiB, kmax
    # 64 KiB (half the queue). Bytes are not scaled: rate x time is the same at any scale.
    ecn: str = setting(
        "off", "switches mark CE on the lossless class (RED: ecn_kmin_bytes, "
        "ecn_kmax_bytes, ecn_pmax); brings the lossless class (unpaused without pfc on)",
        choices=ECN_MODES)
    ecn_kmin_bytes: int = setting(16384, "no marks below this queue, bytes", whole=True,
                                  low=0, metavar="BYTES")
    ecn_kmax_bytes: int = setting(65536, "every ECT frame marked from this queue on, bytes",
                                  whole=True, low=1, high=(1 << 31) - 1, metavar="BYTES")
    ecn_pmax: float = setting(0.2, "the marking probability at kmax", number=True, low=0,
                              low_open=True, high=1)

    def check_ecn(self, where: str) -> None:
        if not self.ecn_kmin_bytes < self.ecn_kmax_bytes:
            raise SpecError(f"{where}.ecn_kmax_bytes", f"{self.ecn_kmax_bytes} must be above "
                            f"ecn_kmin_bytes ({self.ecn_kmin_bytes})")

    @property
    def marking(self) -> Ecn | None:
        """The ECN profile the switches mark with, or None (ecn off)."""
        if self.ecn != "on":
            return None
        return Ecn(self.ecn_kmin_bytes, self.ecn_kmax_bytes, float(self.ecn_pmax))


class CountersUnavailableError(RuntimeError):
    """The kernel would not load or attach the counters (the message says why)."""


class HookConfig(ctypes.Structure):
    """The `cfg` of fabric/bpf/queue.bpf.c, field for field (0: a feature off)."""

    _fields_ = [(name, ctypes.c_uint32) for name in (
        "slot", "dscp", "ingress_base", "ingress_ports", "dropped", "ecn_kmax", "ecn_kmin",
        "ecn_p16", "trim_threshold", "trim_entry", "wake_entry")] + [
        ("ifindex", ctypes.c_uint32 * MAX_PORTS), ("dst_count", ctypes.c_uint32),
        ("dst_addr", ctypes.c_uint32 * MAX_DSTS)]


def hook_config(slot: int, dscp: int, ingress: tuple[int, list[int]] | None = None,
                ecn: tuple[int, Ecn] | None = None, trim: tuple[int, int, Trim] | None = None,
                wake_entry: int = 0, dsts: tuple[str, ...] = ()) -> HookConfig:
    """The counter for `slot`: IPv4 frames whose DSCP is `dscp` add len and 1 to it.
    With `ingress` = (base, [ifindex of each port of this switch]), the frame is also
    added to entry base + j, j the port it came in by (base + len(ports): any other,
    e.g. sent by the switch itself): who put the bytes into this queue.
    With `ecn` = (entry, Ecn), the frame is then marked as the module docstring says.
    With `trim` = (dropped entry, trim entry, Trim), a UET data frame that would pass the
    threshold is trimmed first and not counted (fabric.trimming).
    With `wake_entry` (and the ring given to `load_hook`), a counted frame wakes the
    sleeping controller (fabric.queue_wake).
    With `dsts` (IPv4 addresses: the port's virtual output queues, fabric.voq), a frame to
    dsts[j] is counted in queue 1 + j, any other in queue 0: every entry above moves by
    the queue (in and out by 2 per queue, attribution by len(ports) + 1, the others by 1)."""
    cfg = HookConfig(slot=slot, dscp=dscp, wake_entry=wake_entry)
    if len(dsts) > MAX_DSTS:
        raise ValueError(f"{len(dsts)} destination queues; the program counts {MAX_DSTS} "
                         f"at most")
    cfg.dst_count = len(dsts)
    cfg.dst_addr[:len(dsts)] = [struct.unpack("=I", ipaddress.IPv4Address(a).packed)[0]
                                for a in dsts]
    if ingress is not None:
        base, ifindexes = ingress
        if len(ifindexes) > MAX_PORTS:
            raise ValueError(f"{len(ifindexes)} ports to attribute; the program names "
                             f"{MAX_PORTS} at most")
        cfg.ingress_base, cfg.ingress_ports = base, len(ifindexes)
        cfg.ifindex[:len(ifindexes)] = ifindexes
    if ecn is not None:
        cfg.dropped, profile = ecn
        cfg.ecn_kmin, cfg.ecn_kmax = profile.kmin_bytes, profile.kmax_bytes
        cfg.ecn_p16 = round(profile.pmax * PROB_ONE)
    if trim is not None:
        cfg.dropped, cfg.trim_entry, rule = trim
        cfg.trim_threshold = rule.threshold_bytes
    return cfg


def load_hook(map_fd: int, cfg: HookConfig, ring_fd: int = -1) -> int:
    """queue.bpf.c's counting program with `cfg` on the counters' map `map_fd` (and the
    controller's ring `ring_fd`: a program that wakes it); its fd."""
    if ring_fd >= 0:
        return libbpf.load_program("queue", "aft_count_wake", cfg,
                                   {"counters": map_fd, "ring": ring_fd})
    return libbpf.load_program("queue", "aft_count", cfg, {"counters": map_fd},
                               skip_maps=("ring",))


def create_map(slots: int) -> int:
    """The counters' map: `slots` (bytes, frames) entries, mmapable."""
    return libbpf.create_map(libbpf.BPF_MAP_TYPE_ARRAY, 4, VALUE.size, slots,
                             libbpf.BPF_F_MMAPABLE, "aft_counters")


def map_values(map_fd: int, slots: int) -> tuple[mmap.mmap, memoryview]:
    """The counters' map of `slots` entries in this process's memory: (the mapping, its
    u64 values: bytes and frames of each entry, in turn), read and written in place."""
    size = -(-slots * VALUE.size // mmap.PAGESIZE) * mmap.PAGESIZE
    mm = mmap.mmap(map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, memoryview(mm).cast("Q")


@contextlib.contextmanager
def scratch_hook(slots: int, cfg: HookConfig):
    """The counter program with `cfg` on a fresh counters map of `slots` entries, to
    check it in this kernel (BPF_PROG_TEST_RUN: testbed doctor, the tests): (its fd, the
    map's values), both closed afterwards. OSError where the kernel refuses."""
    map_fd, prog_fd, mm, values = create_map(slots), -1, None, None
    try:
        mm, values = map_values(map_fd, slots)
        prog_fd = load_hook(map_fd, cfg)
        yield prog_fd, values
    finally:
        if values is not None:
            values.release()
            mm.close()
        for fd in (prog_fd, map_fd):
            if fd >= 0:
                os.close(fd)


def make_waker(map_fd: int, values: memoryview, entry: int) -> Waker:
    """fabric.queue_wake's ring and arming program on the counters' map (`values` its
    mapping, `entry` the armed flag's); OSError where the kernel refuses."""
    ring_fd = arm_fd = -1
    try:
        ring_fd = libbpf.create_map(libbpf.BPF_MAP_TYPE_RINGBUF, 0, 0, RING_BYTES, 0,
                                    "aft_wake")
        arm_fd = libbpf.load_program("queue", "aft_arm", HookConfig(wake_entry=entry),
                                     {"counters": map_fd}, skip_maps=("ring",))
        return Waker(ring_fd, arm_fd, values, entry, libbpf.test_run)
    except OSError:
        for fd in (ring_fd, arm_fd):
            if fd >= 0:
                os.close(fd)
        raise


@dataclass(frozen=True)
class Slot:
    """One counted queue: its egress entry is 2 x index, its peer's ingress 2 x index + 1;
    for a port of an attributed node, `ingress_base` + j counts what came in by the
    node's j-th port (`ingress_ports`), + len(ingress_ports) anything else. A port with
    virtual output queues has 1 + n slots in a row: `sub` 0 its lossless class's other
    frames, 1 + j its queue of destination `dst` (tbf `handle`; 0: the port's only one)."""

    node: str
    ifname: str
    peer: str
    peer_ifname: str
    index: int
    ingress_base: int = -1
    ingress_ports: tuple[str, ...] = ()
    sub: int = 0
    dst: str = ""
    handle: int = 0


class QueueCounters:
    """Attach the counters to `ports` [(node, ifname)] of `fab` for frames of `dscp`,
    with per-ingress entries on the ports of `attribute` (node names). close() detaches
    everything it attached. With `wake`, the ports of `attribute` wake a sleeping
    controller (`waker`, fabric.queue_wake; None and `wake_unavailable` says why where
    the kernel refuses)."""

    def __init__(self, fab, ports: list[tuple[str, str]], dscp: int,
                 attribute: frozenset[str] = frozenset(), ecn: Ecn | None = None,
                 trim: dict[int, Trim] | None = None, wake: bool = False,
                 voqs: dict[tuple[str, str], tuple[tuple[str, int], ...]] | None = None):
        self.fab = fab
        self.dscp = dscp
        self.ecn = ecn                  # CE marking at the egress of `attribute`'s ports
        self.trim = trim or {}          # port index -> trimming there (fabric.trimming)
        # (node, ifname) -> its queues with virtual output queues (fabric.voq), as
        # (destination address, tbf handle): first ("", the lossless class's other
        # frames' handle), then one per destination
        self.voqs = voqs or {}
        peers = {(n, p.ifname): (p.peer, fab.plan.port(p.peer, n).ifname)
                 for n, plist in fab.plan.ports.items() for p in plist}
        queues = [(n, i, sub, dst, handle) for n, i in ports
                  for sub, (dst, handle) in enumerate(self._queues_of(n, i))]
        base = 2 * len(queues)
        self.slots = []
        for k, (n, i, sub, dst, handle) in enumerate(queues):
            names: tuple[str, ...] = ()
            slot_base = -1
            if n in attribute:
                names = tuple(p.ifname for p in fab.plan.ports[n])
                slot_base, base = base, base + len(names) + 1
            self.slots.append(Slot(n, i, *peers[(n, i)], k, slot_base, names, sub, dst, handle))
        n_slots = len(self.slots)
        self.ecn_base = base            # per slot: (bytes dropped, CE marks)
        self.load_base = base + n_slots      # per slot: (recent bytes, frames steered)
        self.trim_base = base + 2 * n_slots  # (fabric.switch_lb); (bytes, frames) trimmed
        self.entries = base + 3 * n_slots or 1
        self.wake_entry = self.entries if wake else -1   # (armed, wakes)
        self.entries += wake
        self.waker: Waker | None = None
        self.wake_unavailable = "" if wake else "not asked for"
        self.map_fd = -1
        self.prog_fds: list[int] = []
        self.attached: list[tuple[str, str]] = []     # (node, ifname) with our clsact
        self.mm: mmap.mmap | None = None
        self.values: memoryview | None = None

    def _queues_of(self, node: str, ifname: str) -> list[tuple[str, int]]:
        """A port's queues as (destination, tbf handle): its lossless class alone, or its
        virtual output queues (`voqs`)."""
        return list(self.voqs.get((node, ifname), ())) or [("", 0)]

    def attach(self) -> QueueCounters:
        try:
            self._attach()
        except (OSError, ValueError) as exc:   # ValueError: a switch of > MAX_PORTS ports
            self.close()
            raise CountersUnavailableError(f"eBPF queue counters not available: {exc}") from None
        return self

    def _attach(self) -> None:
        self.map_fd = create_map(self.entries)
        self.mm, self.values = map_values(self.map_fd, self.entries)
        if self.wake_entry >= 0:
            self._make_waker()
        where: dict[tuple[str, str], list[tuple[str, int, Slot]]] = {}
        for s in self.slots:
            if s.sub:           # counted by its port's programs (queue.bpf.c: dest_queue)
                continue
            where.setdefault((s.node, s.ifname), []).append((CLSACT_EGRESS, 2 * s.index, s))
            where.setdefault((s.peer, s.peer_ifname), []).append(
                (CLSACT_INGRESS, 2 * s.index + 1, s))
        by_node: dict[str, list] = {}
        for (node, ifname), hooks in where.items():
            by_node.setdefault(node, []).append((ifname, hooks))
        for node, ports in by_node.items():
            with netns.entered(self.fab.ns(node)), IPRoute() as ipr:
                indexes = {lk.get_attr("IFLA_IFNAME"): lk["index"] for lk in ipr.get_links()}
                for ifname, hooks in ports:
                    index = indexes[ifname]
                    ipr.tc("add", "clsact", index)
                    self.attached.append((node, ifname))
                    for parent, entry, slot in hooks:
                        ingress = ecn = trim = None
                        dsts = tuple(d for d, _ in
                                     self.voqs.get((slot.node, slot.ifname), ())[1:])
                        if parent == CLSACT_EGRESS and slot.ingress_ports:
                            ingress = (slot.ingress_base,
                                       [indexes[i] for i in slot.ingress_ports])
                            if self.ecn is not None:
                                ecn = (self.ecn_base + slot.index, self.ecn)
                            if slot.index in self.trim:
                                trim = (self.ecn_base + slot.index,
                                        self.trim_base + slot.index, self.trim[slot.index])
                        wakes = self.waker is not None and ingress is not None
                        cfg = hook_config(entry, self.dscp, ingress, ecn, trim,
                                          self.wake_entry if wakes else 0, dsts)
                        fd = load_hook(self.map_fd, cfg,
                                       self.waker.ring_fd if wakes else -1)
                        self.prog_fds.append(fd)
                        ipr.tc("add-filter", "bpf", index, ":1", fd=fd,
                               name=f"{NAME_PREFIX}{entry}", parent=parent, classid=1,
                               direct_action=True)

    def _make_waker(self) -> None:
        """The ring and the arming program; where the kernel refuses, the reason."""
        try:
            self.waker = make_waker(self.map_fd, self.values, self.wake_entry)
        except OSError as exc:
            self.wake_unavailable = f"BPF ring buffer wake-up not available: {exc}"

    def set_dropped(self, index: int, nbytes: int) -> None:
        """Bytes slot `index` took in that its qdisc dropped (the marking programs take
        them out of the occupancy)."""
        self.values[2 * (self.ecn_base + index)] = nbytes

    def set_load(self, index: int, nbytes: int) -> None:
        """Bytes slot `index` sent lately (fabric.switch_lb reads it as the port's load;
        its programs add each frame they steer there until the next write)."""
        self.values[2 * (self.load_base + index)] = nbytes

    def steered(self, index: int) -> int:
        """Frames the switch programs steered to slot `index`'s port."""
        return self.values[2 * (self.load_base + index) + 1]

    def trimmed(self, index: int) -> int:
        """Frames slot `index`'s port trimmed (fabric.trimming)."""
        return self.values[2 * (self.trim_base + index) + 1]

    def marks(self, index: int) -> int:
        """Frames slot `index` marked CE."""
        return self.values[2 * (self.ecn_base + index) + 1]

    def counts(self, index: int) -> tuple[int, int, int, int]:
        """(bytes in, frames in, bytes out, frames out) of slot `index`."""
        v, k = self.values, 4 * index
        return v[k], v[k + 1], v[k + 2], v[k + 3]

    def by_ingress(self, index: int) -> dict[str, int]:
        """Bytes slot `index` took in, by the port they came in by ("" for any other)."""
        s, v = self.slots[index], self.values
        names = [*s.ingress_ports, ""]
        return {name: v[2 * (s.ingress_base + j)] for j, name in enumerate(names)}

    def close(self) -> None:
        if self.waker is not None:
            self.waker.close()
            self.waker = None
        if self.values is not None:
            self.values.release()
            self.values = None
        if self.mm is not None:
            with contextlib.suppress(BufferError):   # a reader's view still open: the
                self.mm.close()                     # map goes when it does
            self.mm = None
        by_node: dict[str, list[str]] = {}
        for node, ifname in self.attached:
            by_node.setdefault(node, []).append(ifname)
        for node, ifnames in by_node.items():
            try:
                with netns.entered(self.fab.ns(node)), IPRoute() as ipr:
                    for ifname in ifnames:
                        found = ipr.link_lookup(ifname=ifname)
                        if found:
                            ipr.tc("del", "clsact", found[0])
            except OSError:          # the namespace is gone: so are the filters
                pass
        self.attached.clear()
        for fd in [*self.prog_fds, self.map_fd]:
            if fd >= 0:
                os.close(fd)
        self.prog_fds.clear()
        self.map_fd = -1
