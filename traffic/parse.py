"""The receiver's view of a RoCEv2 frame (traffic.packets builds them): decoded without
scapy, from a whole Ethernet frame (`parse`, ICRC checked) or from the UDP payload a
socket bound to port 4791 gets (`parse_bth`).
"""

from __future__ import annotations

import struct
from ipaddress import IPv4Address

from traffic.packets import (
    AETH_BYTES,
    AETH_OPCODES,
    BTH_BYTES,
    ETH_BYTES,
    ETHERTYPE_IPV4,
    ICRC_BYTES,
    IP_PROTO_UDP,
    IPV4_BYTES,
    PSN_MASK,
    RETH_BYTES,
    RETH_OPCODES,
    ROCE_UDP_PORT,
    SACK_BYTES,
    STAMP,
    STAMP_BYTES,
    UDP_BYTES,
    icrc_of,
)


def parse(frame: bytes | bytearray | memoryview) -> dict:
    """Decode a RoCEv2-over-IPv4 Ethernet frame without scapy.

    Keys: src, dst, dscp, ecn, ttl, sport, dport, opcode, solicited, padcount, pkey,
    fecn, becn, dqpn, ackreq, psn, payload_bytes, ts_ns/msg_id/offset (None without a
    stamp), syndrome/msn (ACK; sack_base_psn/sack_bitmap/sack_ce_count with a SACK block),
    va/rkey/dma_len (RETH), icrc, icrc_ok.
    Raises ValueError on a frame that is not RoCEv2 over IPv4.
    """
    mv = memoryview(frame)
    if len(mv) < ETH_BYTES + IPV4_BYTES + UDP_BYTES + BTH_BYTES + ICRC_BYTES:
        raise ValueError(f"frame of {len(mv)} bytes is too short for RoCEv2")
    if struct.unpack_from(">H", mv, 12)[0] != ETHERTYPE_IPV4:
        raise ValueError("not an IPv4 frame")
    vihl, tos, ip_len, _, _, ttl, proto = struct.unpack_from(">BBHHHBB", mv, ETH_BYTES)
    ihl = (vihl & 0x0F) * 4
    udp = ETH_BYTES + ihl
    if vihl >> 4 != 4 or proto != IP_PROTO_UDP:
        raise ValueError("not UDP over IPv4")
    sport, dport = struct.unpack_from(">HH", mv, udp)
    if dport != ROCE_UDP_PORT:
        raise ValueError(f"UDP destination port {dport} is not RoCEv2's {ROCE_UDP_PORT}")
    bth = udp + UDP_BYTES
    end = ETH_BYTES + ip_len          # ignores Ethernet padding after the IP packet
    if end > len(mv) or end - ICRC_BYTES < bth + BTH_BYTES:
        raise ValueError("IP total length does not fit the frame")
    out: dict = {
        "src": str(IPv4Address(bytes(mv[ETH_BYTES + 12:ETH_BYTES + 16]))),
        "dst": str(IPv4Address(bytes(mv[ETH_BYTES + 16:ETH_BYTES + 20]))),
        "dscp": tos >> 2, "ecn": tos & 0x3, "ttl": ttl, "sport": sport, "dport": dport,
        **_bth_fields(mv, bth, end - ICRC_BYTES),
    }
    out["icrc"] = struct.unpack_from("<I", mv, end - ICRC_BYTES)[0]
    out["icrc_ok"] = out["icrc"] == icrc_of(mv[:end])
    return out


def parse_bth(udp_payload: bytes | bytearray | memoryview) -> dict:
    """Decode a RoCEv2 UDP payload (BTH onward), as a UDP socket bound to port 4791 gets it.

    The kernel has stripped Ethernet, IP and UDP, so there is no ICRC check here (it
    covers the IP header). Keys: opcode, solicited, padcount, pkey, fecn, becn, dqpn,
    ackreq, psn, payload_bytes; ts_ns/msg_id/offset on data packets with a stamp (None
    otherwise); syndrome/msn on an ACK, and sack_base_psn/sack_bitmap/sack_ce_count when it
    carries a SACK block; va/rkey/dma_len with a RETH. Raises ValueError on a short datagram.
    """
    mv = memoryview(udp_payload)
    if len(mv) < BTH_BYTES + ICRC_BYTES:
        raise ValueError(f"datagram of {len(mv)} bytes is too short for BTH + ICRC")
    return _bth_fields(mv, 0, len(mv) - ICRC_BYTES)


def _bth_fields(mv: memoryview, bth: int, end: int) -> dict:
    """BTH at offset `bth` and what follows it (RETH, AETH + SACK, stamp) up to `end`,
    where the ICRC starts: the part parse() and parse_bth() share."""
    op, flags, pkey, resv8a = struct.unpack_from(">BBHB", mv, bth)
    psn_word = struct.unpack_from(">I", mv, bth + 8)[0]
    pad = (flags >> 4) & 0x3
    out: dict = {
        "opcode": op, "solicited": bool(flags & 0x80), "padcount": pad, "pkey": pkey,
        "fecn": bool(resv8a & 0x80), "becn": bool(resv8a & 0x40),
        "dqpn": int.from_bytes(mv[bth + 5:bth + 8], "big"),
        "ackreq": bool(psn_word & 0x80000000), "psn": psn_word & PSN_MASK,
        "ts_ns": None, "msg_id": None, "offset": None,
    }
    payload = bth + BTH_BYTES
    if op in RETH_OPCODES:
        out["va"], out["rkey"], out["dma_len"] = struct.unpack_from(">QII", mv, payload)
        payload += RETH_BYTES
    elif op in AETH_OPCODES:
        aeth = struct.unpack_from(">I", mv, payload)[0]
        out["syndrome"], out["msn"] = aeth >> 24, aeth & PSN_MASK
        payload += AETH_BYTES
        if end - payload >= SACK_BYTES:
            base, bitmap = struct.unpack_from(">IQ", mv, payload)
            out["sack_base_psn"], out["sack_bitmap"] = base & PSN_MASK, bitmap
            out["sack_ce_count"] = base >> 24     # CE marks echoed (cc = nscc)
            payload += SACK_BYTES
    payload_bytes = end - payload - pad
    if payload_bytes < 0:
        raise ValueError("datagram too short for its headers")
    out["payload_bytes"] = payload_bytes
    if payload_bytes >= STAMP_BYTES and op not in AETH_OPCODES:
        out["ts_ns"], out["msg_id"], out["offset"] = STAMP.unpack_from(mv, payload)
    return out
