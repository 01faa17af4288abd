"""PFC (802.1Qbb): the pause frame a lossless fabric sends beside RoCE (traffic.packets).

    Ether dst=01:80:C2:00:00:01 type=0x8808 | MAC control opcode 0x0101 | 8 bits reserved
    | class-enable vector (bit p = priority p) | pause time c0 .. c7 (16 bits each) | pad

scapy.contrib.mac_control declares the layer (MACControlClassBasedFlowControl, bound to
Ether type 0x8808) and pads the frame to the 64-byte minimum with the FCS counted: 60
bytes as a socket sends it. One quantum is 512 bit times at the link rate; 0 = resume.
"""

from __future__ import annotations

from scapy.contrib.mac_control import MACControl, MACControlClassBasedFlowControl
from scapy.layers.l2 import Ether

from traffic.packets import ETH_BYTES, check_range

PFC_DST_MAC = MACControl.DEFAULT_DST_MAC            # 01:80:c2:00:00:01
ETHERTYPE_MAC_CONTROL = 0x8808
OPCODE_PFC = MACControl.OP_CODE_CLASS_BASED_FLOW_CONTROL   # 0x0101
QUANTUM_BITS = 512               # one pause quantum = 512 bit times at the link rate
MAX_QUANTA = 0xFFFF
PFC_FRAME_BYTES = 60             # the minimum Ethernet frame, without its FCS
PFC_HEADER_BYTES = ETH_BYTES + 2 + 2 + 8 * 2   # up to c7's pause time: 34
PFC_PRIORITIES = range(8)


def pfc_frame(src_mac: str, pause: dict[int, int]) -> bytes:
    """A PFC frame pausing priority p for pause[p] quanta (0 = resume), built by scapy."""
    fields = {}
    for prio, quanta in pause.items():
        check_range("priority", prio, 0, 7)
        check_range("pause quanta", quanta, 0, MAX_QUANTA)
        fields[f"c{prio}_enabled"] = 1
        fields[f"c{prio}_pause_time"] = quanta
    frame = bytes(Ether(dst=PFC_DST_MAC, src=src_mac, type=ETHERTYPE_MAC_CONTROL)
                  / MACControlClassBasedFlowControl(**fields))
    if len(frame) != PFC_FRAME_BYTES:       # scapy pads MAC control frames itself
        raise AssertionError(f"PFC frame of {len(frame)} bytes, not {PFC_FRAME_BYTES}")
    return frame


def parse_pfc_frame(frame: bytes | bytearray) -> dict | None:
    """src, enable_vector and pause_quanta (eight, c0 first) of a PFC frame, decoded by
    scapy; None if the frame is not one."""
    if len(frame) < PFC_HEADER_BYTES:       # scapy would fill a truncated frame in
        return None
    pkt = Ether(bytes(frame))
    if pkt.dst != PFC_DST_MAC or MACControlClassBasedFlowControl not in pkt:
        return None
    cbfc = pkt[MACControlClassBasedFlowControl]
    return {"src": pkt.src,
            "enable_vector": sum(getattr(cbfc, f"c{p}_enabled") << p for p in PFC_PRIORITIES),
            "pause_quanta": [getattr(cbfc, f"c{p}_pause_time") for p in PFC_PRIORITIES]}


def quanta_s(quanta: int, rate_mbps: float) -> float:
    """How long `quanta` pause quanta last on a link of `rate_mbps`."""
    return quanta * QUANTUM_BITS / (rate_mbps * 1e6)
