"""Packet trimming at switch egress (Ultra Ethernet): a UET data frame that would push
its port's queue past the threshold is cut to its headers and sent on at high priority
instead of being dropped, so its receiver learns of the loss at once and NACKs it.

    switch port p, clsact egress (fabric.queue_counters' program for p, this block first)
      lossless-class frame: occupancy of p's queue (in - out - dropped) + its length
        > threshold, and a UET data frame (UDP 4791, BTH data opcode, dQPN bit 23)?
      ─▶ bpf_skb_change_tail to TRIMMED_FRAME_BYTES: Ethernet | IPv4 | UDP | BTH | stamp
         (PSN, message id and offset survive; payload and ICRC do not)
      ─▶ DSCP := TRIM_DSCP (ECN bits kept), IP total length and checksum
         (bpf_l3_csum_replace), UDP length, UDP checksum 0 ("none", RFC 768)
      ─▶ counted per port (bytes it had, frames), not counted into the lossless queue
      ─▶ the qdisc: a u32 filter sends TRIM_DSCP to the control class (fabric.lossless,
         HTB prio 0, served before data) at this port and every later hop

The receiving agent knows a trimmed datagram by its length (BTH + stamp, nothing else:
no data packet is that short, since each carries its stamp and an ICRC), NACKs its PSN
at once and the sender resends it (traffic.transport). RoCE frames are never trimmed:
an RC responder has no use for a header without its payload.

How this differs from a UEC switch: the decision reads the queue the eBPF counters see
(bytes sent into the port minus bytes that reached its peer), not the switch buffer
itself, and the frame keeps its own headers (the testbed's BTH and stamp stand for UET's
PDS and SES headers). The UEC specification lets a switch trim to a configured size and
mark trimmed packets with a configured DSCP; the testbed does both, with its own values.

`block` emits the eBPF instructions (queue_counters' assembler); `trimmed_frame_ok`
checks what came out, for `testbed doctor` and the tests (BPF_PROG_TEST_RUN).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from topologies.physics import ROCE_FRAME_BYTES
from topologies.settings import setting
from topologies.spec import SpecError

# Wire sizes and fields as traffic.packets declares them (copied, not imported: the
# fabric layer does not load scapy; tests/test_trimming.py checks they agree).
ETH_BYTES, IPV4_BYTES, UDP_BYTES, BTH_BYTES, STAMP_BYTES = 14, 20, 8, 12, 16
IP_PROTO_UDP, ROCE_UDP_PORT = 17, 4791
UET_QPN_FLAG = 1 << 23          # a UET-style flow's destination QP
DATA_OPCODE_MAX = 0x0A          # RC data opcodes 0x00-0x0a (SEND, RDMA WRITE)

TRIM_DSCP = 46                  # trimmed frames on the wire (EF: a capture filters on it)
TRIMMED_UDP_PAYLOAD = BTH_BYTES + STAMP_BYTES                     # 28 B: BTH + stamp
TRIMMED_FRAME_BYTES = ETH_BYTES + IPV4_BYTES + UDP_BYTES + TRIMMED_UDP_PAYLOAD   # 70 B
BPF_FUNC_SKB_STORE_BYTES, BPF_FUNC_L3_CSUM_REPLACE, BPF_FUNC_SKB_CHANGE_TAIL = 9, 10, 38
TC_ACT_SHOT = 2
SKB_LEN = 0                                         # struct __sk_buff
HDR = -64          # stack: the frame's bytes 14..49 (IPv4, UDP, BTH up to the dQPN)
NEW = -80          # stack: header bytes being written
HDR_FROM, HDR_BYTES = ETH_BYTES, 36
IP_CSUM_AT = ETH_BYTES + 10
UDP_LEN_AT = ETH_BYTES + IPV4_BYTES + 4


@dataclass(frozen=True)
class Trim:
    """Trim at a port whose queue (bytes, this frame included) would pass `threshold`."""

    threshold_bytes: int

    def __post_init__(self) -> None:
        if not TRIMMED_FRAME_BYTES < self.threshold_bytes < 1 << 31:
            raise ValueError(f"trim threshold must be in ({TRIMMED_FRAME_BYTES}, 2^31) "
                             f"bytes, got {self.threshold_bytes}")


TRIM_MODES = ("off", "on")


@dataclass
class TrimSettings:
    """Trimming: switches cut UET data frames to their headers at full queues"""

    trimming: str = setting(
        "off", "switches cut a UET data frame to its headers instead of dropping it when "
        "its queue would pass trim_threshold_bytes; the receiver NACKs it at once; needs "
        "transport uet; brings the lossless class (unpaused without pfc on)",
        choices=TRIM_MODES)
    trim_threshold_bytes: int = setting(
        0, "the queue, bytes, past which a UET data frame is trimmed (0: each port's queue "
        "less one RoCE frame, where it would be dropped); bytes are not scaled",
        whole=True, low=0, high=(1 << 31) - 1, metavar="BYTES")

    def check_trimming(self, where: str) -> None:
        if 0 < self.trim_threshold_bytes <= TRIMMED_FRAME_BYTES:
            raise SpecError(f"{where}.trim_threshold_bytes", f"must be 0 (derived) or above "
                            f"{TRIMMED_FRAME_BYTES} (a trimmed frame), got "
                            f"{self.trim_threshold_bytes}")

    def trim_at(self, queue_bytes: int) -> Trim | None:
        """Trimming at a port whose lossless queue holds `queue_bytes`, or None (off)."""
        if self.trimming != "on":
            return None
        derived = max(TRIMMED_FRAME_BYTES + 1, queue_bytes - ROCE_FRAME_BYTES)
        return Trim(self.trim_threshold_bytes or derived)


def _be16(value: int) -> int:
    """A 16-bit big-endian field as a little-endian half-word load sees it."""
    return struct.unpack("<H", struct.pack(">H", value))[0]


def block(a, map_fd: int, slot: int, dropped_entry: int, trim_entry: int,
          trim: Trim) -> None:
    """The trimming block of a counter's egress program (r6 = skb, the frame already
    known to be IPv4 of the lossless DSCP): either trims, counts and exits (`out`), or
    falls through at label `keep` (the frame goes on whole and is counted as usual)."""
    a.lookup(map_fd, key=slot)
    a.op(0x79, 8, 0, 0)                               # r8 = bytes in
    a.lookup(map_fd, key=slot + 1)
    a.op(0x79, 9, 0, 0)
    a.op(0x1F, 8, 9)                                  # r8 -= bytes out
    a.lookup(map_fd, key=dropped_entry)
    a.op(0x79, 9, 0, 0)
    a.op(0x1F, 8, 9)                                  # r8 -= bytes dropped
    a.op(0x61, 7, 6, SKB_LEN)                         # r7 = len
    a.jump(0xB5, "keep", 7, TRIMMED_FRAME_BYTES)      # if len <= trimmed: keep
    a.op(0x0F, 8, 7)                                  # r8 += len
    a.jump(0xD5, "keep", 8, trim.threshold_bytes)     # if r8 s<= threshold: keep
    a.op(0xBF, 1, 6)                                  # the headers -> stack (HDR)
    a.op(0xB7, 2, imm=HDR_FROM)
    a.op(0xBF, 3, 10)
    a.op(0x07, 3, imm=HDR)
    a.op(0xB7, 4, imm=HDR_BYTES)
    a.op(0x85, imm=26)                                # bpf_skb_load_bytes
    a.jump(0x55, "keep", 0, 0)                        # a short frame: not UET data
    a.op(0x71, 1, 10, HDR)
    a.jump(0x55, "keep", 1, 0x45)                     # IPv4 without options
    a.op(0x71, 1, 10, HDR + 9)
    a.jump(0x55, "keep", 1, IP_PROTO_UDP)
    a.op(0x69, 1, 10, HDR + IPV4_BYTES + 2)
    a.jump(0x55, "keep", 1, _be16(ROCE_UDP_PORT))     # UDP destination port 4791
    a.op(0x71, 1, 10, HDR + IPV4_BYTES + UDP_BYTES)
    a.jump(0x25, "keep", 1, DATA_OPCODE_MAX)          # an ACK or CNP: never trimmed
    a.op(0x71, 1, 10, HDR + IPV4_BYTES + UDP_BYTES + 5)
    a.op(0x57, 1, imm=UET_QPN_FLAG >> 16)
    a.jump(0x15, "keep", 1, 0)                        # RoCE (RC): never trimmed
    a.op(0xBF, 1, 6)
    a.op(0xB7, 2, imm=TRIMMED_FRAME_BYTES)
    a.op(0xB7, 3, imm=0)
    a.op(0x85, imm=BPF_FUNC_SKB_CHANGE_TAIL)
    a.jump(0x55, "keep", 0, 0)                        # could not cut: it goes whole
    a.op(0x69, 8, 10, HDR)                            # r8 = old version/IHL + TOS
    a.op(0x69, 9, 10, HDR + 2)                        # r9 = old total length
    a.op(0x71, 1, 10, HDR + 1)
    a.op(0x57, 1, imm=3)                              # ECN bits kept
    a.op(0x47, 1, imm=TRIM_DSCP << 2)
    a.op(0x67, 1, imm=8)
    a.op(0x47, 1, imm=0x45)
    a.op(0x6B, 10, 1, NEW)                            # new version/IHL + TOS
    a.op(0x6A, 10, 0, NEW + 2, _be16(TRIMMED_FRAME_BYTES - ETH_BYTES))
    _store(a, ETH_BYTES, 4)
    for old, new in ((8, None), (9, _be16(TRIMMED_FRAME_BYTES - ETH_BYTES))):
        a.op(0xBF, 1, 6)
        a.op(0xB7, 2, imm=IP_CSUM_AT)
        a.op(0xBF, 3, old)
        if new is None:
            a.op(0x69, 4, 10, NEW)
        else:
            a.op(0xB7, 4, imm=new)
        a.op(0xB7, 5, imm=2)                          # a 16-bit field
        a.op(0x85, imm=BPF_FUNC_L3_CSUM_REPLACE)
        a.jump(0x55, "broken", 0, 0)
    a.op(0x6A, 10, 0, NEW, _be16(UDP_BYTES + TRIMMED_UDP_PAYLOAD))
    a.op(0x6A, 10, 0, NEW + 2, 0)                     # UDP length, checksum 0
    _store(a, UDP_LEN_AT, 4)
    a.lookup(map_fd, key=trim_entry)
    a.op(0xDB, 0, 7, 0, 0)                            # lock trimmed bytes += len
    a.op(0xB7, 7, imm=1)
    a.op(0xDB, 0, 7, 8, 0)                            # lock trimmed frames += 1
    a.jump(0x05, "out")
    a.label("broken")                                 # cut but not mended: dropped
    a.op(0xB7, 0, imm=TC_ACT_SHOT)
    a.op(0x95)
    a.label("keep")


def _store(a, offset: int, size: int) -> None:
    """Write `size` bytes from the stack at NEW into the frame at `offset`."""
    a.op(0xBF, 1, 6)
    a.op(0xB7, 2, imm=offset)
    a.op(0xBF, 3, 10)
    a.op(0x07, 3, imm=NEW)
    a.op(0xB7, 4, imm=size)
    a.op(0xB7, 5, imm=0)
    a.op(0x85, imm=BPF_FUNC_SKB_STORE_BYTES)
    a.jump(0x55, "broken", 0, 0)


def ip_checksum(header: bytes) -> int:
    """The checksum of an IPv4 header whose checksum field is 0; 0 over a header that
    carries its checksum (scapy's, imported on use: the fabric modules load no scapy)."""
    from scapy.utils import checksum
    return checksum(header)


def ip_checksum_ok(header: bytes) -> bool:
    """The one's-complement sum of an IPv4 header, its checksum included, is 0xffff."""
    return ip_checksum(header) == 0


def trimmed_frame_ok(frame: bytes) -> str | None:
    """None if `frame` is a well-formed trimmed frame, else what is wrong with it."""
    if len(frame) != TRIMMED_FRAME_BYTES:
        return f"{len(frame)} bytes, not {TRIMMED_FRAME_BYTES}"
    ip = frame[ETH_BYTES:ETH_BYTES + IPV4_BYTES]
    if ip[1] >> 2 != TRIM_DSCP:
        return f"DSCP {ip[1] >> 2}, not {TRIM_DSCP}"
    if struct.unpack("!H", ip[2:4])[0] != TRIMMED_FRAME_BYTES - ETH_BYTES:
        return "IP total length not mended"
    if not ip_checksum_ok(ip):
        return "IP header checksum wrong"
    udp_len, udp_sum = struct.unpack_from("!HH", frame, UDP_LEN_AT)
    if udp_len != UDP_BYTES + TRIMMED_UDP_PAYLOAD or udp_sum:
        return f"UDP length {udp_len} / checksum {udp_sum:#x}"
    return None
