"""The per-packet patchers of traffic.packets' templates, bound to one buffer each.

traffic.packets lays a template out once (scapy, offsets, the CRC constants) and asks
this module for the function the hot path calls per packet; the functions live here,
apart from the scapy layer declarations, so that this module compiles (traffic.engine).

    data_patcher(...) -> DataPatch: patch(psn, sport, ts_ns, msg_id, offset), or
        patch.write(...): UDP source port, PSN word and stamp in one
        struct.pack_into, then the ICRC: zlib's CRC32 of the varying head,
        carried across the fixed tail by the linear map F(c) = lo[c & 0xFFFF] ^ hi[c >> 16],
        xor the template's constant k (and the UDP checksum, when enabled); compiled, the
        common case (a stamp, no extension header, no UDP checksum) stores the same
        bytes from C and calls zlib's crc32 directly (traffic/patch.pxd)
    ack_patcher(...) -> a closure, patch(psn, sport, syndrome, msn, base, bitmap): AETH,
        SACK block, source port, PSN word, then the ICRC: CRC32 of the whole IP packet
        xor a constant
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable

import cython

PSN_MASK = 0xFFFFFF             # as traffic.packets.PSN_MASK
SACK_WORD_MASK = 0xFFFFFFFF     # as traffic.packets.SACK_WORD_MASK
ICRC = struct.Struct("<I")
UDP_CHECKSUM = struct.Struct(">H")
AETH_WORD = struct.Struct(">I")
SACK_BLOCK = struct.Struct(">IQ")
SPORT = struct.Struct(">H")
PSN_WORD = struct.Struct(">I")


class DataPatch:
    """patch(psn, sport, ts_ns=0, msg_id=0, offset=0) bound to `buf`, also as
    `patch.write(...)` (the agent's hot path calls that: compiled, a C call).
    traffic.packets' Template.patcher gives the arguments (data_patcher). It checks
    nothing: psn < 2^24, sport < 2^16, msg_id and offset < 2^32."""

    __slots__ = ("buf", "head", "pack", "pack_icrc", "pack_ck", "crc32", "udp", "ck_at",
                 "icrc_at", "mid", "ext", "seed", "lo", "hi", "k", "udp_base", "ack",
                 "stamped", "checksum", "common", "head_at", "head_len", "psn_at")

    def __init__(self, buf: bytearray, head_at: int, region: struct.Struct,
                 fixed: tuple, udp: int, icrc_at: int, seed: int, lo: array, hi: array,
                 k: int, udp_base: int, ack: int, stamped: bool, checksum: bool):
        self.buf = buf
        # the head: buf[head_at:] up to the varying region's end, hashed by the CRC
        self.head_at, self.head_len = head_at, udp + region.size - head_at
        self.head = memoryview(buf)[head_at:head_at + self.head_len]
        self.psn_at = udp + 2 + len(fixed[0])       # the region: sport, mid, PSN word...
        self.pack = region.pack_into
        self.pack_icrc = ICRC.pack_into
        self.pack_ck = UDP_CHECKSUM.pack_into
        self.crc32 = zlib.crc32
        self.udp = udp
        self.ck_at = udp + 6
        self.icrc_at = icrc_at
        self.mid, self.ext = fixed[0], fixed[1:]
        self.seed = seed
        self.lo, self.hi = lo, hi
        self.k = k
        self.udp_base = udp_base
        self.ack = ack
        self.stamped = stamped
        self.checksum = checksum
        self.common = stamped and not self.ext and not checksum   # 3 calls per packet

    def __call__(self, psn: int, sport: int, ts_ns: int = 0, msg_id: int = 0,
                 offset: int = 0) -> None:
        self.write(psn, sport, ts_ns, msg_id, offset)

    def write(self, psn: int, sport: int, ts_ns: int = 0, msg_id: int = 0,
              offset: int = 0) -> None:
        buf = self.buf
        word = self.ack | psn
        if self.common:
            if cython.compiled:     # the same bytes, stored from C (traffic/patch.pxd)
                write_common(self, word, sport, ts_ns, msg_id, offset)  # noqa: F821
                return
            self.pack(buf, self.udp, sport, self.mid, word, ts_ns, msg_id, offset)
            c = self.crc32(self.head, self.seed)
            self.pack_icrc(buf, self.icrc_at, self.lo[c & 0xFFFF] ^ self.hi[c >> 16] ^ self.k)
            return
        if self.stamped:
            self.pack(buf, self.udp, sport, self.mid, word, *self.ext, ts_ns, msg_id, offset)
        else:
            self.pack(buf, self.udp, sport, self.mid, word)
            ts_ns = msg_id = offset = 0
        c = self.crc32(self.head, self.seed)
        c = self.lo[c & 0xFFFF] ^ self.hi[c >> 16] ^ self.k
        self.pack_icrc(buf, self.icrc_at, c)
        if self.checksum:   # ICRC bytes are little-endian: their word sum is c * 256
            s = (self.udp_base + sport + word + ts_ns + msg_id + offset + (c << 8)) % 0xFFFF
            self.pack_ck(buf, self.ck_at, 0xFFFF - s)


def data_patcher(buf: bytearray, head_at: int, region: struct.Struct, fixed: tuple,
                 udp: int, icrc_at: int, seed: int, lo: array, hi: array, k: int,
                 udp_base: int, ack: int, stamped: bool, checksum: bool) -> DataPatch:
    """The data patcher bound to `buf` (DataPatch)."""
    return DataPatch(buf, head_at, region, fixed, udp, icrc_at, seed, lo, hi, k, udp_base,
                     ack, stamped, checksum)


def ack_patcher(buf: bytearray, head: memoryview, seed: int, k: int, udp: int, psn_at: int,
                aeth_at: int, sack_at: int | None, icrc_at: int,
                ack: int) -> Callable[..., None]:
    """patch(psn, sport, syndrome, msn, base=0, bitmap=0) bound to `buf`, with `.buf`
    (traffic.packets' Template.ack_patcher gives the arguments)."""
    crc32 = zlib.crc32
    pack_aeth, pack_sack = AETH_WORD.pack_into, SACK_BLOCK.pack_into
    pack_sport, pack_psn, pack_icrc = SPORT.pack_into, PSN_WORD.pack_into, ICRC.pack_into

    def patch(psn: int, sport: int, syndrome: int, msn: int, base: int = 0,
              bitmap: int = 0) -> None:
        pack_aeth(buf, aeth_at, (syndrome << 24) | (msn & PSN_MASK))
        if sack_at is not None:
            pack_sack(buf, sack_at, base & SACK_WORD_MASK, bitmap)
        pack_sport(buf, udp, sport)
        pack_psn(buf, psn_at, ack | psn)
        pack_icrc(buf, icrc_at, crc32(head, seed) ^ k)

    patch.buf = buf
    return patch
