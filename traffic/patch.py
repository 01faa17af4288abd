"""The per-packet patchers of traffic.packets' templates: closures bound to one buffer.

traffic.packets lays a template out once (scapy, offsets, the CRC constants) and asks
this module for the function the hot path calls per packet; the functions live here,
apart from the scapy layer declarations, so that this module compiles (traffic.engine).

    data_patcher(...)(psn, sport, ts_ns, msg_id, offset): UDP source port, PSN word and
        stamp in one struct.pack_into, then the ICRC: zlib's CRC32 of the varying head,
        carried across the fixed tail by the linear map F(c) = lo[c & 0xFFFF] ^ hi[c >> 16],
        xor the template's constant k (and the UDP checksum, when enabled)
    ack_patcher(...)(psn, sport, syndrome, msn, base, bitmap): AETH, SACK block, source
        port, PSN word, then the ICRC: CRC32 of the whole IP packet xor a constant
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable

PSN_MASK = 0xFFFFFF             # as traffic.packets.PSN_MASK
SACK_WORD_MASK = 0xFFFFFFFF     # as traffic.packets.SACK_WORD_MASK
ICRC = struct.Struct("<I")
UDP_CHECKSUM = struct.Struct(">H")
AETH_WORD = struct.Struct(">I")
SACK_BLOCK = struct.Struct(">IQ")
SPORT = struct.Struct(">H")
PSN_WORD = struct.Struct(">I")


def data_patcher(buf: bytearray, head: memoryview, region: struct.Struct, fixed: tuple,
                 udp: int, icrc_at: int, seed: int, lo: array, hi: array, k: int,
                 udp_base: int, ack: int, stamped: bool,
                 checksum: bool) -> Callable[..., None]:
    """patch(psn, sport, ts_ns=0, msg_id=0, offset=0) bound to `buf` (traffic.packets'
    Template.patcher gives the arguments). It checks nothing: psn < 2^24, sport < 2^16,
    msg_id and offset < 2^32."""
    pack = region.pack_into
    pack_icrc = ICRC.pack_into
    pack_ck = UDP_CHECKSUM.pack_into
    crc32 = zlib.crc32
    ck_at = udp + 6
    mid, ext = fixed[0], fixed[1:]

    if stamped and not ext and not checksum:   # the common case, kept to 3 calls

        def patch(psn: int, sport: int, ts_ns: int = 0, msg_id: int = 0,
                  offset: int = 0) -> None:
            pack(buf, udp, sport, mid, ack | psn, ts_ns, msg_id, offset)
            c = crc32(head, seed)
            pack_icrc(buf, icrc_at, lo[c & 0xFFFF] ^ hi[c >> 16] ^ k)

        return patch

    def patch(psn: int, sport: int, ts_ns: int = 0, msg_id: int = 0,
              offset: int = 0) -> None:
        word = ack | psn
        if stamped:
            pack(buf, udp, sport, mid, word, *ext, ts_ns, msg_id, offset)
        else:
            pack(buf, udp, sport, mid, word)
            ts_ns = msg_id = offset = 0
        c = crc32(head, seed)
        c = lo[c & 0xFFFF] ^ hi[c >> 16] ^ k
        pack_icrc(buf, icrc_at, c)
        if checksum:   # ICRC bytes are little-endian: their word sum is c * 256
            s = (udp_base + sport + word + ts_ns + msg_id + offset + (c << 8)) % 0xFFFF
            pack_ck(buf, ck_at, 0xFFFF - s)

    return patch


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
