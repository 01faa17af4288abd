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

The trimmed frame's layout is fabric.wire's (TRIM_DSCP, TRIMMED_FRAME_BYTES); the program
is `trim()` in fabric/bpf/queue.bpf.c, which reads the same layout from fabric/bpf/wire.h;
`trimmed_frame_ok` checks what came out, for `testbed doctor` and the tests
(BPF_PROG_TEST_RUN).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fabric.wire import (
    DSCP_SHIFT,
    ETH_BYTES,
    IP_AT,
    IPV4_BYTES,
    TRIM_DSCP,
    TRIMMED_FRAME_BYTES,
    TRIMMED_UDP_PAYLOAD,
    UDP_BYTES,
    UDP_LEN_AT,
)
from topologies.physics import ROCE_FRAME_BYTES
from topologies.settings import setting
from topologies.spec import SpecError


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
    ip = frame[IP_AT:IP_AT + IPV4_BYTES]
    if ip[1] >> DSCP_SHIFT != TRIM_DSCP:
        return f"DSCP {ip[1] >> DSCP_SHIFT}, not {TRIM_DSCP}"
    if struct.unpack("!H", ip[2:4])[0] != TRIMMED_FRAME_BYTES - ETH_BYTES:
        return "IP total length not mended"
    if not ip_checksum_ok(ip):
        return "IP header checksum wrong"
    udp_len, udp_sum = struct.unpack_from("!HH", frame, UDP_LEN_AT)
    if udp_len != UDP_BYTES + TRIMMED_UDP_PAYLOAD or udp_sum:
        return f"UDP length {udp_len} / checksum {udp_sum:#x}"
    return None
