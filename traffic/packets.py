"""RoCEv2 packets: layers declared as scapy does, templates built once, a fast patcher.

One packet on the wire (RoCE's 4096-byte MTU: the payload, not the frame):

    Ether | IPv4 (DSCP/ECN in TOS, DF) | UDP sport=entropy dport=4791 | BTH opcode/dqpn/PSN
          | [RETH (RDMA WRITE FIRST/ONLY) | AETH (ACK)] | payload (stamp at its head) | ICRC

scapy builds every template once (`Template.build`). The hot path never calls scapy: a
patcher writes the UDP source port (entropy), PSN and the 16-byte stamp (send time,
message id, byte offset) into a bytearray with one `struct.pack_into`, then the ICRC:

    ICRC = CRC32 over  8 x 0xFF (pseudo LRH) | IP (TOS, TTL, checksum := 1s)
                       | UDP (checksum := 1s) | BTH (resv8a/FECN/BECN := 1s) | rest
    stored little-endian after the payload (as scapy.contrib.roce does).

Only the head of a packet varies (sport .. stamp); the rest is fixed per template. CRC32
is affine, so the patcher hashes the head with zlib and carries the register across the
fixed tail with a precomputed linear map (two 64 Ki-entry tables, cached per tail
length), instead of hashing 4 KiB per packet. Masked header fields are constant per
template, so hashing the unmasked head and XOR-ing one constant gives the masked CRC.

Checksums: the IPv4 header is invariant per template (fixed id, DF set), so scapy's
checksum holds for every packet. The UDP checksum is 0 by default: that is what RoCEv2
NICs send (the ICRC protects the packet) and what RFC 768 defines as "no checksum" over
IPv4. `udp_checksum=True` makes the patcher keep a correct non-zero checksum instead,
updated per packet with one's-complement arithmetic (about 10 % more time per packet).

UET-style flows reuse the RC opcodes (so scapy and Wireshark decode them unchanged) and
are told apart by a destination QP with bit 23 set (`UET_QPN_FLAG`): sprayed entropy,
out-of-order delivery, selective acknowledgement with a SACK block after the AETH.

The sizes, offsets, opcodes and syndromes are fabric.wire's (no scapy), which also lays
out the PFC (802.1Qbb) pause frames a lossless fabric sends beside RoCE; the receiver's
view of a frame (`parse`, `parse_bth`) is in traffic.parse.
"""

from __future__ import annotations

import struct
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers
from scapy.utils import checksum

from fabric.traffic_class import DEFAULT_DSCP, DEFAULT_PRIORITY  # noqa: F401 (the lossless class)
from fabric.wire import (  # noqa: F401 (the layouts, also read as traffic.packets')
    ACKREQ_BIT,
    AETH_BYTES,
    AETH_OPCODES,
    BTH_BYTES,
    ECN_CE,
    ECN_ECT0,
    ECN_ECT1,
    ECN_NOT_ECT,
    ETH_BYTES,
    ETHERTYPE_IPV4,
    ICRC_BYTES,
    IP_DST_AT,
    IP_LEN_AT,
    IP_PROTO_UDP,
    IP_SRC_AT,
    IPV4_BYTES,
    PSEUDO_LRH,
    PSN_IN_BTH,
    PSN_MASK,
    QPN_MASK,
    RETH_BYTES,
    RETH_OPCODES,
    ROCE_UDP_PORT,
    SACK_BYTES,
    STAMP,
    STAMP_BYTES,
    UDP_BYTES,
    UET_QPN_FLAG,
    Opcode,
    Syndrome,
    check_range,
)
from topologies.spec import MTU_BYTES
from traffic.entropy import SPORT_MIN
from traffic.patch import ack_patcher, data_patcher

# -- protocol constants (the layouts are fabric.wire's) ---------------------------------
ROCE_MTU_BYTES = 4096           # RoCE path MTU: payload bytes per packet
CNP_DSCP = 48                   # congestion notification packets, strict priority
DEFAULT_ECN = ECN_ECT0          # ECN-capable, as DCQCN senders mark their packets
DEFAULT_TTL = 64
DEFAULT_PKEY = 0xFFFF           # default partition, full membership
SACK_WORD_MASK = 0xFFFFFFFF     # SACK base word: CE count (8 bits) | base PSN (24 bits)


class Transport(StrEnum):
    RC = "rc"     # in order, go-back-N after a sequence-error NAK
    UET = "uet"   # entropy sprayed per packet, out-of-order accepted, selective ACK


def transport_of(dqpn: int) -> Transport:
    return Transport.UET if dqpn & UET_QPN_FLAG else Transport.RC


# -- layers scapy.contrib.roce does not declare ---------------------------------------
class RETH(Packet):
    """RDMA Extended Transport Header (IBA 9.3.3)."""

    name = "RETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dma_len", 0),
    ]


class SACK(Packet):
    """Selective-ACK block of the UET-style transport, after the AETH of an ACK.

    Bit i of `bitmap` says PSN (base_psn + i) arrived; the AETH MSN/PSN say the rest.
    `ce_count`: CE-marked data packets since the previous ACK, saturating at 255 (cc =
    "nscc" echoes them, traffic.nscc; 0 otherwise).
    """

    name = "SACK"
    fields_desc = [
        BitField("ce_count", 0, 8),
        BitField("base_psn", 0, 24),
        XLongField("bitmap", 0),
    ]


class Stamp(Packet):
    """The testbed's 16 bytes at the head of every data payload (not an IB header)."""

    name = "Stamp"
    fields_desc = [
        BitField("ts_ns", 0, 64),      # sender clock (CLOCK_MONOTONIC), nanoseconds
        IntField("msg_id", 0),
        IntField("offset", 0),         # byte offset of this payload in its message
    ]


for _op in RETH_OPCODES:
    bind_layers(BTH, RETH, opcode=int(_op))
bind_layers(AETH, SACK)

now_ns: Callable[[], int] = time.monotonic_ns   # the stamp's clock, shared by all namespaces


# -- the ICRC, straight from the definition (reference; used by parse and tests) -------
def masked_icrc_input(frame: bytes | bytearray | memoryview) -> bytes:
    """The bytes the ICRC covers, variant fields set to 1s (IPv4 only)."""
    mv = memoryview(frame)
    ihl = (mv[ETH_BYTES] & 0x0F) * 4
    ip_len = struct.unpack_from(">H", mv, IP_LEN_AT)[0]
    end = ETH_BYTES + ip_len - ICRC_BYTES
    udp = ETH_BYTES + ihl
    bth = udp + UDP_BYTES
    head = bytearray(mv[ETH_BYTES:bth + BTH_BYTES])
    head[1] = 0xFF                      # TOS (DSCP + ECN)
    head[8] = 0xFF                      # TTL
    head[10:12] = b"\xff\xff"           # header checksum
    head[ihl + 6:ihl + 8] = b"\xff\xff"  # UDP checksum
    head[ihl + UDP_BYTES + 4] = 0xFF    # BTH resv8a: FECN, BECN, reserved
    return PSEUDO_LRH + bytes(head) + bytes(mv[bth + BTH_BYTES:end])


def icrc_of(frame: bytes | bytearray | memoryview) -> int:
    """The ICRC a frame should carry (as an integer; on the wire it is little-endian)."""
    return zlib.crc32(masked_icrc_input(frame))


def wire_icrc(frame: bytes | bytearray | memoryview) -> int:
    """The ICRC a frame does carry (the 4 bytes before the end of the IP packet)."""
    ip_len = struct.unpack_from(">H", frame, IP_LEN_AT)[0]
    return struct.unpack_from("<I", frame, ETH_BYTES + ip_len - ICRC_BYTES)[0]


# -- carrying a CRC register across a fixed tail ----------------------------------------
@lru_cache(maxsize=64)
def _shift_tables(tail_bytes: int) -> tuple[array, array]:
    """Tables of the linear map F(c) = CRC32 register after `tail_bytes` zero bytes.

    F(c) = lo[c & 0xFFFF] ^ hi[c >> 16]; built from the images of the 32 basis bits.
    Shared by every template with the same tail length (512 KiB per length).
    """
    zeros = bytes(tail_bytes)

    def image(bit: int) -> int:
        return zlib.crc32(zeros, (1 << bit) ^ 0xFFFFFFFF) ^ 0xFFFFFFFF

    tables = []
    for half in (0, 16):
        table = [0]
        for bit in range(16):
            img = image(half + bit)
            table += [x ^ img for x in table]
        tables.append(array("I", table))
    return tables[0], tables[1]


# -- templates ------------------------------------------------------------------------
@dataclass(frozen=True)
class Addresses:
    """Where a frame goes: link-layer next hop and the IP endpoints (loopbacks)."""

    src_mac: str
    dst_mac: str
    src_ip: str
    dst_ip: str


Patcher = Callable[..., None]


@dataclass(frozen=True, eq=False)
class Template:
    """One RoCEv2 packet built by scapy, plus where the hot path patches it.

    Offsets are from the start of the Ethernet frame. `stamp` is None when the payload
    has no room for the 16-byte stamp (ACKs, tiny payloads); `ext` is the RETH/AETH.
    """

    frame: bytes                   # the packet as scapy built it (psn/sport as given)
    packet: Packet = field(repr=False)   # the scapy packet, for sendp and for tests
    opcode: int
    dqpn: int
    payload_bytes: int
    ackreq: bool
    udp_checksum: bool
    ip: int
    udp: int
    bth: int
    ext: int | None
    payload: int
    stamp: int | None
    icrc: int
    # derived: the patcher's constants
    _region: struct.Struct = field(repr=False)   # sport .. end of the varying head
    _fixed: tuple[bytes, ...] = field(repr=False)  # invariant bytes inside the region
    _seed: int = field(repr=False)                 # CRC32 of the pseudo LRH
    _lo: array = field(repr=False)                 # F(c) = lo[c & 0xFFFF] ^ hi[c >> 16]
    _hi: array = field(repr=False)
    _k: int = field(repr=False)                    # masked ICRC = F(crc of the head) ^ k
    _udp_base: int = field(repr=False)             # one's-complement sum of the fixed part

    # -- building (scapy, once) --------------------------------------------------------
    @classmethod
    def build(cls, opcode: int, addresses: Addresses, *, dqpn: int,
              payload_bytes: int | None = None, payload: bytes | None = None,
              psn: int = 0, sport: int = SPORT_MIN,
              dscp: int = DEFAULT_DSCP, ecn: int = DEFAULT_ECN, ttl: int = DEFAULT_TTL,
              pkey: int = DEFAULT_PKEY, ackreq: bool = False, solicited: bool = False,
              becn: bool = False,
              va: int = 0, rkey: int = 0, dma_len: int | None = None,
              syndrome: int = Syndrome.ACK, msn: int = 0, sack: bool = False,
              udp_checksum: bool = False, ip_id: int = 0) -> Template:
        """Build the packet with scapy and lay out the patcher for it.

        `payload_bytes` is the IB payload (default: RoCE's MTU, 4096; none on an ACK); it
        is padded to a multiple of 4 (BTH padcount). `payload` gives its bytes (default:
        zeros; the patcher overwrites the first 16 with the stamp).
        RDMA WRITE FIRST/ONLY get a RETH (`va`, `rkey`, `dma_len`, default the payload);
        ACK gets an AETH (`syndrome`, `msn`) and, with `sack`, a SACK block. A CNP
        (opcode 0x81) carries 16 reserved bytes (`payload_bytes=16`) and `becn`.
        """
        opcode = int(opcode)
        if payload is not None:
            if payload_bytes is not None and payload_bytes != len(payload):
                raise ValueError("payload_bytes: differs from len(payload)")
            payload_bytes = len(payload)
        if payload_bytes is None:
            payload_bytes = 0 if opcode in AETH_OPCODES else ROCE_MTU_BYTES
        if payload_bytes and opcode in AETH_OPCODES:
            raise ValueError("payload_bytes: an ACK carries no payload")
        check_range("dqpn", dqpn, 0, QPN_MASK)
        check_range("psn", psn, 0, PSN_MASK)
        check_range("sport", sport, 0, 0xFFFF)
        check_range("dscp", dscp, 0, 63)
        check_range("ecn", ecn, 0, 3)
        check_range("payload_bytes", payload_bytes, 0, MTU_BYTES)
        pad = -payload_bytes % 4
        pkt = (Ether(src=addresses.src_mac, dst=addresses.dst_mac)
               / IP(src=addresses.src_ip, dst=addresses.dst_ip, tos=(dscp << 2) | ecn,
                    ttl=ttl, id=ip_id, flags="DF")
               / UDP(sport=sport, dport=ROCE_UDP_PORT, chksum=None if udp_checksum else 0)
               / BTH(opcode=opcode, solicited=int(solicited), padcount=pad, pkey=pkey,
                     becn=int(becn), dqpn=dqpn, ackreq=int(ackreq), psn=psn))
        ext_bytes = 0
        if opcode in RETH_OPCODES:
            pkt = pkt / RETH(va=va, rkey=rkey,
                             dma_len=payload_bytes if dma_len is None else dma_len)
            ext_bytes = RETH_BYTES
        elif opcode in AETH_OPCODES:
            pkt = pkt / AETH(syndrome=syndrome, msn=msn)
            ext_bytes = AETH_BYTES
            if sack:
                pkt = pkt / SACK()
                ext_bytes += SACK_BYTES
        elif sack:
            raise ValueError("sack: a SACK block rides on an ACK only")
        if payload_bytes or pad:
            pkt = pkt / Raw((payload or bytes(payload_bytes)) + bytes(pad))
        frame = bytes(pkt)
        if len(frame) - ETH_BYTES > MTU_BYTES:
            raise ValueError(f"payload_bytes: a {len(frame) - ETH_BYTES}-byte IP packet "
                             f"exceeds the fabric MTU ({MTU_BYTES})")
        return cls._lay_out(frame, pkt, opcode, dqpn, payload_bytes, ackreq, udp_checksum,
                            ext_bytes)

    @classmethod
    def _lay_out(cls, frame: bytes, pkt: Packet, opcode: int, dqpn: int, payload_bytes: int,
                 ackreq: bool, udp_checksum: bool, ext_bytes: int) -> Template:
        ip = ETH_BYTES
        udp = ip + (frame[ip] & 0x0F) * 4
        bth = udp + UDP_BYTES
        ext = bth + BTH_BYTES if ext_bytes else None
        payload = bth + BTH_BYTES + ext_bytes
        icrc = len(frame) - ICRC_BYTES
        stamp = payload if payload_bytes >= STAMP_BYTES else None
        # The varying region: sport, then the PSN word, then (if any) the stamp.
        psn_word = bth + PSN_IN_BTH
        if stamp is not None:
            region_end = stamp + STAMP_BYTES
            fmt = f">H{psn_word - udp - 2}sI" + (f"{ext_bytes}s" if ext_bytes else "") + "QII"
            fixed = (frame[udp + 2:psn_word],) + ((frame[ext:payload],) if ext_bytes else ())
        else:
            region_end = psn_word + 4
            fmt = f">H{psn_word - udp - 2}sI"
            fixed = (frame[udp + 2:psn_word],)
        if udp_checksum:   # the region is written with the checksum 0, then the sum goes in
            fixed = (fixed[0][:4] + b"\0\0" + fixed[0][6:],) + fixed[1:]
        lo, hi = _shift_tables(icrc - region_end)
        seed = zlib.crc32(PSEUDO_LRH)
        # CRC32 is affine: masked ICRC = F(crc32 of unmasked head) ^ K, K fixed here.
        probe = bytearray(frame)
        if udp_checksum:
            probe[udp + 6:udp + 8] = b"\0\0"
        c = zlib.crc32(memoryview(probe)[ip:region_end], seed)
        k = icrc_of(probe) ^ lo[c & 0xFFFF] ^ hi[c >> 16]
        udp_base = _udp_fixed_sum(frame, udp, region_end, stamp is not None) if udp_checksum else 0
        return cls(frame=frame, packet=pkt, opcode=opcode, dqpn=dqpn,
                   payload_bytes=payload_bytes, ackreq=ackreq, udp_checksum=udp_checksum,
                   ip=ip, udp=udp, bth=bth, ext=ext, payload=payload, stamp=stamp, icrc=icrc,
                   _region=struct.Struct(fmt), _fixed=fixed, _seed=seed, _lo=lo, _hi=hi,
                   _k=k, _udp_base=udp_base)

    @property
    def sport(self) -> int:
        """The UDP source port the template was built with."""
        return struct.unpack_from(">H", self.frame, self.udp)[0]

    # -- the hot path ------------------------------------------------------------------
    def buffer(self) -> bytearray:
        """A fresh copy of the frame to patch and send."""
        return bytearray(self.frame)

    def patcher(self, buf: bytearray) -> Patcher:
        """A function patch(psn, sport, ts_ns=0, msg_id=0, offset=0) bound to `buf`.

        It writes the fields and a correct ICRC (and UDP checksum if enabled) into
        `buf`, a copy of this template's frame. Everything it needs is a local variable,
        and it checks nothing: psn < 2^24, sport < 2^16, msg_id and offset < 2^32.
        ACK templates are patched with `patch_ack` instead.
        """
        if self.opcode in AETH_OPCODES:
            raise ValueError("ACK templates are patched with patch_ack")
        if len(buf) != len(self.frame):
            raise ValueError(f"buffer is {len(buf)} bytes, template frame {len(self.frame)}")
        return data_patcher(buf, self.ip, self._region, self._fixed, self.udp, self.icrc,
                            self._seed, self._lo, self._hi, self._k, self._udp_base,
                            ACKREQ_BIT if self.ackreq else 0, self.stamp is not None,
                            self.udp_checksum)

    def patch(self, buf: bytearray, psn: int, sport: int, ts_ns: int = 0, msg_id: int = 0,
              offset: int = 0) -> bytearray:
        """Patch one buffer (convenience; loops should hold a `patcher(buf)`)."""
        self.patcher(buf)(psn, sport, ts_ns, msg_id, offset)
        return buf

    def patch_ack(self, buf: bytearray, psn: int, sport: int, syndrome: int, msn: int,
                  sack_base_psn: int = 0, sack_bitmap: int = 0,
                  sack_ce_count: int = 0) -> bytearray:
        """Set an ACK's AETH (and SACK block), then the PSN/sport/ICRC (not on a hot path)."""
        if self.ext is None or self.opcode not in AETH_OPCODES:
            raise ValueError(f"opcode {self.opcode:#x} carries no AETH")
        struct.pack_into(">I", buf, self.ext, (syndrome << 24) | (msn & PSN_MASK))
        if self.payload - self.ext > AETH_BYTES:
            check_range("sack_ce_count", sack_ce_count, 0, 255)
            struct.pack_into(">IQ", buf, self.ext + AETH_BYTES,
                             (sack_ce_count << 24) | (sack_base_psn & PSN_MASK), sack_bitmap)
        # The AETH is outside the hashed head: recompute the ICRC from the definition.
        struct.pack_into(">H", buf, self.udp, sport)
        struct.pack_into(">I", buf, self.bth + PSN_IN_BTH, (ACKREQ_BIT if self.ackreq else 0) | psn)
        if self.udp_checksum:
            struct.pack_into(">H", buf, self.udp + 6, 0)
        struct.pack_into("<I", buf, self.icrc, icrc_of(buf))
        if self.udp_checksum:
            struct.pack_into(">H", buf, self.udp + 6, udp_checksum_of(buf))
        return buf

    def ack_patcher(self, buf: bytearray) -> Callable[..., None]:
        """A fast `patch_ack` for one buffer: patch(psn, sport, syndrome, msn, base, bitmap),
        `base` the SACK base word (CE count in its top byte, base PSN below: the UET
        receiver's `ack_fields` give it so).

        The ICRC is a CRC over PSEUDO_LRH + the IP packet with its variant fields set to
        1s. Those fields never change in `buf`, so the masked input differs from the bytes
        in `buf` by a constant, and (CRC32 being affine for a fixed length) the ICRC is
        crc32(buf[ip:icrc], crc32(PSEUDO_LRH)) xor a constant taken once from icrc_of.
        With UDP checksums on, it falls back to patch_ack."""
        if self.ext is None or self.opcode not in AETH_OPCODES:
            raise ValueError(f"opcode {self.opcode:#x} carries no AETH")
        if self.udp_checksum:
            def slow(psn, sport, syndrome, msn, base=0, bitmap=0):
                self.patch_ack(buf, psn, sport, syndrome, msn, base & PSN_MASK, bitmap,
                               (base >> 24) & 0xFF)
            slow.buf = buf
            return slow
        head = memoryview(buf)[self.ip:self.icrc]
        seed = zlib.crc32(PSEUDO_LRH)
        k = icrc_of(buf) ^ zlib.crc32(head, seed)
        return ack_patcher(buf, head, seed, k, self.udp, self.bth + PSN_IN_BTH, self.ext,
                           self.ext + AETH_BYTES if self.payload - self.ext > AETH_BYTES
                           else None, self.icrc, ACKREQ_BIT if self.ackreq else 0)


def _udp_fixed_sum(frame: bytes, udp: int, region_end: int, has_stamp: bool) -> int:
    """One's-complement sum (mod 0xFFFF) of the UDP pseudo header and datagram, with the
    varying fields (sport, PSN word, stamp), the checksum and the ICRC taken as zero."""
    ip_len = struct.unpack_from(">H", frame, IP_LEN_AT)[0]
    datagram = bytearray(frame[udp:ETH_BYTES + ip_len])
    datagram[0:2] = b"\0\0"          # sport
    datagram[6:8] = b"\0\0"          # checksum
    datagram[16:20] = bytes(4)       # PSN word (BTH bytes 8..11)
    if has_stamp:
        datagram[region_end - udp - STAMP_BYTES:region_end - udp] = bytes(STAMP_BYTES)
    datagram[-ICRC_BYTES:] = bytes(ICRC_BYTES)
    # scapy's checksum is 0xFFFF minus the end-around-carry sum, which is the sum mod 0xFFFF
    return (0xFFFF - checksum(_pseudo_header(frame, len(datagram)) + bytes(datagram))) % 0xFFFF


def _pseudo_header(frame: bytes | bytearray, udp_len: int) -> bytes:
    return (bytes(frame[IP_SRC_AT:IP_DST_AT + 4])
            + struct.pack(">BBH", 0, IP_PROTO_UDP, udp_len))


def udp_checksum_of(frame: bytes | bytearray) -> int:
    """The UDP checksum an IPv4 frame should carry (0xFFFF stands for a zero sum)."""
    ihl = (frame[ETH_BYTES] & 0x0F) * 4
    ip_len = struct.unpack_from(">H", frame, IP_LEN_AT)[0]
    udp = ETH_BYTES + ihl
    datagram = bytearray(frame[udp:ETH_BYTES + ip_len])
    datagram[6:8] = b"\0\0"
    return checksum(_pseudo_header(frame, len(datagram)) + bytes(datagram)) or 0xFFFF


def ipv4_checksum_ok(frame: bytes | bytearray) -> bool:
    ihl = (frame[ETH_BYTES] & 0x0F) * 4
    return checksum(bytes(frame[ETH_BYTES:ETH_BYTES + ihl])) == 0
