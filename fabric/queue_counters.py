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
switch needs to pause the right upstream (testbed.pfc_sources). Only IPv4 frames of the
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

Each program is a few dozen eBPF instructions assembled here (entries are immediates),
loaded with the bpf(2) system call and attached through pyroute2: no compiler, no
libbpf at run time. Where the kernel refuses (no BPF, no clsact), `attach` raises
CountersUnavailableError with the kernel's reason and the controller polls netlink.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
from dataclasses import dataclass

from pyroute2 import IPRoute

from fabric import netns
from fabric.queue_wake import BPF_MAP_TYPE_RINGBUF, RING_BYTES, Waker, arm_block, wake_block
from fabric.trimming import Trim
from fabric.trimming import block as trim_block
from topologies.settings import setting
from topologies.spec import SpecError

SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_MAP_CREATE, BPF_PROG_LOAD, BPF_PROG_TEST_RUN = 0, 5, 10
BPF_MAP_TYPE_ARRAY, BPF_PROG_TYPE_SCHED_CLS = 2, 3
BPF_F_MMAPABLE = 1 << 10
BPF_PSEUDO_MAP_FD = 1
BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_SKB_LOAD_BYTES = 1, 26
BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_SKB_ECN_SET_CE = 7, 97
PROB_ONE = 1 << 16                    # marking probabilities in 1/65536ths
TC_ACT_UNSPEC = -1                    # go on as if no filter were there
CLSACT_INGRESS, CLSACT_EGRESS = "ffff:fff2", "ffff:fff3"
SKB_LEN, SKB_INGRESS_IFINDEX = 0, 36    # offsets in struct __sk_buff
VALUE = struct.Struct("=QQ")          # bytes, frames
ATTR_BYTES = 128
NAME_PREFIX = "aft_q"


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


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


class _Asm:
    """eBPF instructions with labelled jumps (offsets resolved by `assemble`)."""

    def __init__(self) -> None:
        self.code: list[list[int]] = []
        self.labels: dict[str, int] = {}
        self.jumps: list[tuple[int, str]] = []

    def op(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> None:
        self.code.append([code, dst, src, off, imm])

    def jump(self, code: int, label: str, dst: int = 0, imm: int = 0, src: int = 0) -> None:
        self.jumps.append((len(self.code), label))
        self.op(code, dst, src, 0, imm)

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load_bytes(self, offset: int, at: int, size: int) -> None:
        """Copy `size` bytes of the frame (r6, the skb) from `offset` to the stack at
        fp + `at` (bpf_skb_load_bytes: the frame may not be linear); a runt: goto out."""
        self.op(0xBF, 1, 6)                           # r1 = skb
        self.op(0xB7, 2, imm=offset)                  # r2 = offset
        self.op(0xBF, 3, 10)                          # r3 = fp
        self.op(0x07, 3, imm=at)                      # r3 += at
        self.op(0xB7, 4, imm=size)                    # r4 = size
        self.op(0x85, imm=BPF_FUNC_SKB_LOAD_BYTES)
        self.jump(0x55, "out", 0, 0)                  # if r0 != 0 goto out

    def lookup(self, map_fd: int, key_reg: int | None = None, key: int = 0) -> None:
        """r0 = &map[key (an immediate) or key_reg]; on a missing key, goto out."""
        if key_reg is None:
            self.op(0x62, 10, 0, -4, key)             # *(u32 *)(fp - 4) = key
        else:
            self.op(0x63, 10, key_reg, -4)            # *(u32 *)(fp - 4) = key_reg
        self.lookup_at(map_fd, -4)

    def ld_imm64(self, reg: int, value: int, src: int = 0) -> None:
        """r`reg` = a 64-bit immediate, in two instructions; with `src` a pseudo source
        the kernel resolves (the low half a map's fd, the high half an offset)."""
        lo, hi = (struct.unpack("=i", struct.pack("=I", half))[0]
                  for half in (value & 0xFFFFFFFF, value >> 32))
        self.op(0x18, reg, src, 0, lo)
        self.op(0, 0, 0, 0, hi)

    def map_ref(self, reg: int, map_fd: int) -> None:
        """r`reg` = the map `map_fd` (the kernel resolves it)."""
        self.ld_imm64(reg, map_fd, BPF_PSEUDO_MAP_FD)

    def lookup_at(self, map_fd: int, at: int) -> None:
        """r0 = &map[the key on the stack at fp + `at`]; on a missing key, goto out."""
        self.op(0xBF, 2, 10)                          # r2 = fp
        self.op(0x07, 2, imm=at)                      # r2 += at
        self.map_ref(1, map_fd)                       # r1 = map
        self.op(0x85, imm=BPF_FUNC_MAP_LOOKUP_ELEM)   # r0 = &value or NULL
        self.jump(0x15, "out", 0, 0)                  # if r0 == 0 goto out

    def add_to(self, map_fd: int, key_reg: int | None = None, key: int = 0) -> None:
        """value = map[key (an immediate) or key_reg]; value.bytes += r7 (len); value
        .frames += 1, both atomic; on a missing key, goto out."""
        self.lookup(map_fd, key_reg, key)
        self.op(0x61, 7, 6, SKB_LEN)                  # r7 = skb->len
        self.op(0xDB, 0, 7, 0, 0)                     # lock *(u64 *)(r0 + 0) += r7
        self.op(0xB7, 7, imm=1)                       # r7 = 1
        self.op(0xDB, 0, 7, 8, 0)                     # lock *(u64 *)(r0 + 8) += r7

    def assemble(self) -> bytes:
        for pc, label in self.jumps:
            self.code[pc][3] = self.labels[label] - pc - 1
        return b"".join(_insn(*c) for c in self.code)


def mark_ce(a: _Asm, map_fd: int, slot: int, entry: int, ecn: Ecn) -> None:
    """The ECN block of an egress program (`slot` its in-count, slot + 1 its out-count,
    `entry` the dropped bytes (the controller's) and the marks (ours))."""
    a.lookup(map_fd, key=slot)
    a.op(0x79, 8, 0, 0)                               # r8 = bytes in (this frame's too)
    a.lookup(map_fd, key=slot + 1)
    a.op(0x79, 9, 0, 0)                               # r9 = bytes out
    a.op(0x1F, 8, 9)                                  # r8 -= r9
    a.lookup(map_fd, key=entry)
    a.op(0x79, 9, 0, 0)                               # r9 = bytes dropped
    a.op(0x1F, 8, 9)                                  # r8 -= r9: the occupancy
    a.jump(0xD5, "out", 8, ecn.kmin_bytes)            # if r8 s<= kmin goto out
    a.jump(0x75, "mark", 8, ecn.kmax_bytes)           # if r8 s>= kmax goto mark
    a.op(0x85, imm=BPF_FUNC_GET_PRANDOM_U32)          # r0 = random
    a.op(0x57, 0, imm=PROB_ONE - 1)                   # r0 &= 0xffff
    a.op(0x27, 0, imm=ecn.kmax_bytes - ecn.kmin_bytes)  # r0 *= kmax - kmin
    a.op(0x17, 8, imm=ecn.kmin_bytes)                 # r8 -= kmin
    a.op(0x27, 8, imm=round(ecn.pmax * PROB_ONE))     # r8 *= pmax x 65536
    a.jump(0x3D, "out", 0, src=8)                     # if r0 >= r8 goto out (no mark)
    a.label("mark")
    a.op(0xBF, 1, 6)                                  # r1 = skb
    a.op(0x85, imm=BPF_FUNC_SKB_ECN_SET_CE)           # r0 = 1 if it set CE
    a.jump(0x15, "out", 0, 0)                         # not ECT: nothing marked
    a.lookup(map_fd, key=entry)
    a.op(0xB7, 7, imm=1)                              # r7 = 1
    a.op(0xDB, 0, 7, 8, 0)                            # lock marks += 1


def program(map_fd: int, slot: int, dscp: int,
            ingress: tuple[int, list[int]] | None = None,
            ecn: tuple[int, Ecn] | None = None,
            trim: tuple[int, int, Trim] | None = None,
            wake: tuple[int, int] | None = None) -> bytes:
    """The counter for `slot`: IPv4 frames whose DSCP is `dscp` add len and 1 to it.
    With `ingress` = (base, [ifindex of each port of this switch]), the frame is also
    added to entry base + j, j the port it came in by (base + len(ports): any other,
    e.g. sent by the switch itself): who put the bytes into this queue.

    The header bytes are copied with bpf_skb_load_bytes, not read in place: a frame an
    agent sends through AF_PACKET has only its Ethernet header in the linear part, so
    direct packet access would not see its IP header (and it would go uncounted).
    With `ecn` = (entry, Ecn), the frame is then marked as the module docstring says.
    With `trim` = (dropped entry, trim entry, Trim), a UET data frame that would pass the
    threshold is trimmed first and not counted (fabric.trimming).
    With `wake` = (armed entry, ring fd), a counted frame wakes the sleeping controller
    (fabric.queue_wake)."""
    a = _Asm()
    a.op(0xBF, 6, 1)                                  # r6 = skb
    a.load_bytes(12, -16, 4)                          # ethertype, IPv4 TOS -> fp - 16
    a.op(0x69, 4, 10, -16)                            # r4 = ethertype (wire order)
    a.jump(0x55, "out", 4, 0x0008)                    # if r4 != htons(0x0800) goto out
    a.op(0x71, 4, 10, -13)                            # r4 = TOS byte
    a.op(0x77, 4, imm=2)                              # r4 >>= 2 (DSCP)
    a.jump(0x55, "out", 4, dscp)                      # if r4 != dscp goto out
    if trim is not None:
        trim_block(a, map_fd, slot, *trim)
    a.add_to(map_fd, key=slot)
    if ingress is not None:
        base, ifindexes = ingress
        a.op(0x61, 8, 6, SKB_INGRESS_IFINDEX)         # r8 = skb->ingress_ifindex
        a.op(0xB7, 9, imm=base + len(ifindexes))      # r9 = "any other port"
        for j, ifindex in enumerate(ifindexes):
            a.jump(0x55, f"not{j}", 8, ifindex)       # if r8 != ifindex goto not_j
            a.op(0xB7, 9, imm=base + j)               # r9 = base + j
            a.jump(0x05, "found")                     # goto found
            a.label(f"not{j}")
        a.label("found")
        a.add_to(map_fd, key_reg=9)
    if wake is not None:
        wake_block(a, map_fd, *wake)
    if ecn is not None:
        mark_ce(a, map_fd, slot, *ecn)
    a.label("out")
    a.op(0xB7, 0, imm=TC_ACT_UNSPEC)                  # r0 = TC_ACT_UNSPEC
    a.op(0x95)                                        # exit
    return a.assemble()


_LIBC = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: bytes) -> int:
    libc = _LIBC
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_BYTES, b"\0"), ATTR_BYTES)
    fd = libc.syscall(SYS_BPF, cmd, buf, ATTR_BYTES)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def new_map(kind: int, key_bytes: int, value_bytes: int, entries: int,
            flags: int = 0) -> int:
    """A BPF map of `kind` (its fd)."""
    return _bpf(BPF_MAP_CREATE, struct.pack("=IIIII", kind, key_bytes, value_bytes,
                                            entries, flags))


def create_map(slots: int) -> int:
    """The counters' map: `slots` (bytes, frames) entries, mmapable."""
    return new_map(BPF_MAP_TYPE_ARRAY, 4, VALUE.size, slots, BPF_F_MMAPABLE)


def load_program(insns: bytes, name: str, kind: int = BPF_PROG_TYPE_SCHED_CLS) -> int:
    """Load a program (sched_cls unless `kind` says otherwise); the verifier's log is in
    the error if it refuses."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    attr = struct.pack("=IIQQIIQII16s", kind, len(insns) // 8,
                       ctypes.addressof(code), ctypes.addressof(lic), 1, len(log),
                       ctypes.addressof(log), 0, 0, name.encode()[:15])
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        text = log.value.decode(errors="replace").strip().splitlines()
        raise OSError(exc.errno, f"{exc.strerror}: {' | '.join(text[-3:])}") from None


def run_on_frame(prog_fd: int, frame: bytes) -> tuple[int, bytes]:
    """Run a loaded program once on `frame` (BPF_PROG_TEST_RUN, no interface involved):
    (its return value, the frame as it left the program). For `testbed doctor` and
    tests: what a program does to a frame, checked in the kernel that runs it."""
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(len(frame) + 256)
    attr = bytearray(struct.pack("=IIIIQQ", prog_fd, 0, len(frame), len(data_out),
                                 ctypes.addressof(data_in), ctypes.addressof(data_out)))
    attr += struct.pack("=I", 1)                       # repeat
    buf = ctypes.create_string_buffer(bytes(attr).ljust(ATTR_BYTES, b"\0"), ATTR_BYTES)
    if _LIBC.syscall(SYS_BPF, BPF_PROG_TEST_RUN, buf, ATTR_BYTES) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    _, retval, _, size_out = struct.unpack_from("=IIII", buf.raw)
    return struct.unpack("=i", struct.pack("=I", retval))[0], data_out.raw[:size_out]


def make_waker(map_fd: int, values: memoryview, entry: int) -> Waker:
    """fabric.queue_wake's ring and arming program on the counters' map (`values` its
    mapping, `entry` the armed flag's); OSError where the kernel refuses."""
    ring_fd = arm_fd = -1
    try:
        ring_fd = new_map(BPF_MAP_TYPE_RINGBUF, 0, 0, RING_BYTES)
        a = _Asm()
        arm_block(a, map_fd, entry)
        a.label("out")
        a.op(0xB7, 0, imm=0)                          # r0 = 0
        a.op(0x95)                                    # exit
        arm_fd = load_program(a.assemble(), "aft_arm")
        return Waker(ring_fd, arm_fd, values, entry, run_on_frame)
    except OSError:
        for fd in (ring_fd, arm_fd):
            if fd >= 0:
                os.close(fd)
        raise


@dataclass(frozen=True)
class Slot:
    """One counted port: its egress entry is 2 x index, its peer's ingress 2 x index + 1;
    for a port of an attributed node, `ingress_base` + j counts what came in by the
    node's j-th port (`ingress_ports`), + len(ingress_ports) anything else."""

    node: str
    ifname: str
    peer: str
    peer_ifname: str
    index: int
    ingress_base: int = -1
    ingress_ports: tuple[str, ...] = ()


class QueueCounters:
    """Attach the counters to `ports` [(node, ifname)] of `fab` for frames of `dscp`,
    with per-ingress entries on the ports of `attribute` (node names). close() detaches
    everything it attached. With `wake`, the ports of `attribute` wake a sleeping
    controller (`waker`, fabric.queue_wake; None and `wake_unavailable` says why where
    the kernel refuses)."""

    def __init__(self, fab, ports: list[tuple[str, str]], dscp: int,
                 attribute: frozenset[str] = frozenset(), ecn: Ecn | None = None,
                 trim: dict[int, Trim] | None = None, wake: bool = False):
        self.fab = fab
        self.dscp = dscp
        self.ecn = ecn                  # CE marking at the egress of `attribute`'s ports
        self.trim = trim or {}          # port index -> trimming there (fabric.trimming)
        peers = {(n, p.ifname): (p.peer, fab.plan.port(p.peer, n).ifname)
                 for n, plist in fab.plan.ports.items() for p in plist}
        base = 2 * len(ports)
        self.slots = []
        for k, (n, i) in enumerate(ports):
            if n in attribute:
                names = tuple(p.ifname for p in fab.plan.ports[n])
                self.slots.append(Slot(n, i, *peers[(n, i)], k, base, names))
                base += len(names) + 1
            else:
                self.slots.append(Slot(n, i, *peers[(n, i)], k))
        self.ecn_base = base            # per slot: (bytes dropped, CE marks)
        self.load_base = base + len(ports)     # per slot: (recent bytes, frames steered)
        self.trim_base = base + 2 * len(ports)  # (fabric.switch_lb); (bytes, frames) trimmed
        self.entries = base + 3 * len(ports) or 1
        self.wake_entry = self.entries if wake else -1   # (armed, wakes)
        self.entries += wake
        self.waker: Waker | None = None
        self.wake_unavailable = "" if wake else "not asked for"
        self.map_fd = -1
        self.prog_fds: list[int] = []
        self.attached: list[tuple[str, str]] = []     # (node, ifname) with our clsact
        self.mm: mmap.mmap | None = None
        self.values: memoryview | None = None

    def attach(self) -> QueueCounters:
        try:
            self._attach()
        except OSError as exc:
            self.close()
            raise CountersUnavailableError(f"eBPF queue counters not available: {exc}") from None
        return self

    def _attach(self) -> None:
        self.map_fd = create_map(self.entries)
        size = -(-self.entries * VALUE.size // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mm = mmap.mmap(self.map_fd, size, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self.values = memoryview(self.mm).cast("Q")
        if self.wake_entry >= 0:
            self._make_waker()
        where: dict[tuple[str, str], list[tuple[str, int, Slot | None]]] = {}
        for s in self.slots:
            where.setdefault((s.node, s.ifname), []).append((CLSACT_EGRESS, 2 * s.index, s))
            where.setdefault((s.peer, s.peer_ifname), []).append(
                (CLSACT_INGRESS, 2 * s.index + 1, None))
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
                        if slot is not None and slot.ingress_ports:
                            ingress = (slot.ingress_base,
                                       [indexes[i] for i in slot.ingress_ports])
                            if self.ecn is not None:
                                ecn = (self.ecn_base + slot.index, self.ecn)
                            if slot.index in self.trim:
                                trim = (self.ecn_base + slot.index,
                                        self.trim_base + slot.index, self.trim[slot.index])
                        wake = ((self.wake_entry, self.waker.ring_fd)
                                if self.waker is not None and ingress else None)
                        fd = load_program(program(self.map_fd, entry, self.dscp, ingress,
                                                  ecn, trim, wake), f"{NAME_PREFIX}{entry}")
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
