"""The VOQ control frame (fabric.wire): its bytes against the layout written out by hand,
its parse and refusals, and tshark decoding it with fabric/wireshark/aft_voq.lua. No root
needed; the tshark tests skip where tshark is missing or built without Lua."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from fabric import wire
from fabric.wire import VoqMessage, VoqOpcode, parse_voq_frame, voq_frame

SRC_MAC = "02:00:00:00:00:0a"
DST_IP = "198.19.0.5"

# version 1, pause, priority 3, to 198.19.0.5, 65535 quanta, sequence 0x01020304
KNOWN_PAUSE = bytes.fromhex(
    "0180c2000001"      # dst: the MAC-control group address
    "02000000000a"      # src
    "88b6"              # ethertype
    "01" "01" "03" "00"  # version, opcode (pause), priority, reserved
    "c6130005"          # 198.19.0.5
    "ffff" "0000"       # quanta, reserved
    "00000000"          # credit bytes
    "01020304"          # sequence number
    + "00" * 26)        # zero pad to 60

# version 1, credit grant, priority 5, to 198.19.1.2, 4096 bytes, sequence 0xfffffffe
KNOWN_CREDIT = bytes.fromhex(
    "0180c2000001" "02000000000a" "88b6"
    "01" "02" "05" "00"
    "c6130102"
    "0000" "0000"
    "00001000"
    "fffffffe"
    + "00" * 26)


def test_known_answer_bytes():
    assert len(KNOWN_PAUSE) == len(KNOWN_CREDIT) == 60
    assert voq_frame(SRC_MAC, DST_IP, 3, 0xFFFF, seq=0x01020304) == KNOWN_PAUSE
    assert voq_frame(SRC_MAC, "198.19.1.2", 5, opcode=VoqOpcode.CREDIT, credit_bytes=4096,
                     seq=0xFFFFFFFE) == KNOWN_CREDIT


def test_known_frames_parse_to_their_fields():
    assert parse_voq_frame(KNOWN_PAUSE) == VoqMessage(
        src_mac=SRC_MAC, opcode=VoqOpcode.PAUSE, priority=3, dst_ip=DST_IP, quanta=0xFFFF,
        credit_bytes=0, seq=0x01020304)
    assert parse_voq_frame(KNOWN_CREDIT) == VoqMessage(
        src_mac=SRC_MAC, opcode=VoqOpcode.CREDIT, priority=5, dst_ip="198.19.1.2", quanta=0,
        credit_bytes=4096, seq=0xFFFFFFFE)


@pytest.mark.parametrize("kwargs, release", [
    ({"priority": 3, "quanta": 0xFFFF, "seq": 1}, False),                  # pause
    ({"priority": 0, "quanta": 0, "seq": 0xFFFFFFFF}, True),               # release
    ({"priority": 7, "opcode": VoqOpcode.CREDIT, "credit_bytes": 0xFFFFFFFF}, False),
])
def test_round_trip(kwargs, release):
    frame = voq_frame("02:aa:bb:cc:dd:ee", "198.19.3.4", **kwargs)
    assert len(frame) == wire.VOQ_FRAME_BYTES
    msg = parse_voq_frame(bytearray(frame))
    assert msg is not None and msg.release is release
    assert (msg.src_mac, msg.dst_ip) == ("02:aa:bb:cc:dd:ee", "198.19.3.4")
    assert msg.priority == kwargs["priority"]
    assert msg.opcode == kwargs.get("opcode", VoqOpcode.PAUSE)
    assert msg.quanta == kwargs.get("quanta", 0)
    assert msg.credit_bytes == kwargs.get("credit_bytes", 0)
    assert msg.seq == kwargs.get("seq", 0)


def patched(frame: bytes, at: int, value: bytes) -> bytes:
    return frame[:at] + value + frame[at + len(value):]


@pytest.mark.parametrize("frame", [
    patched(KNOWN_PAUSE, 12, b"\x88\xb5"),          # the testbed's kick ethertype
    patched(KNOWN_PAUSE, 12, b"\x88\x08"),          # MAC control (PFC)
    patched(KNOWN_PAUSE, 14, b"\x02"),              # version 2
    patched(KNOWN_PAUSE, 14, b"\x00"),              # version 0
    patched(KNOWN_PAUSE, 15, b"\x03"),              # unknown opcode
    patched(KNOWN_PAUSE, 15, b"\x00"),
    patched(KNOWN_PAUSE, 16, b"\x08"),              # priority 8
    patched(KNOWN_PAUSE, 0, bytes.fromhex("02000000000b")),   # unicast destination
    KNOWN_PAUSE[:33],                               # short of the sequence number
    b"",
])
def test_parse_refuses_what_is_not_a_version_1_voq_frame(frame):
    assert parse_voq_frame(frame) is None


def test_parse_reads_a_frame_without_its_padding_and_ignores_the_reserved_bytes():
    assert parse_voq_frame(KNOWN_PAUSE[:34]) == parse_voq_frame(KNOWN_PAUSE)
    odd = patched(patched(KNOWN_PAUSE, 17, b"\xff"), 24, b"\xff\xff")
    assert parse_voq_frame(odd) == parse_voq_frame(KNOWN_PAUSE)


def test_parse_leaves_pfc_and_ipv4_frames_alone():
    assert parse_voq_frame(wire.pfc_frame(SRC_MAC, {3: 0xFFFF})) is None
    assert wire.parse_pfc_frame(KNOWN_PAUSE) is None


@pytest.mark.parametrize("kwargs, bad", [
    ({"priority": 8}, "priority"),
    ({"priority": -1}, "priority"),
    ({"quanta": 0x10000}, "quanta"),
    ({"quanta": -1}, "quanta"),
    ({"dst_ip": "fd00::1"}, "dst_ip"),
    ({"dst_ip": "198.19.0.256"}, "dst_ip"),
    ({"dst_ip": "leaf0"}, "dst_ip"),
    ({"seq": 1 << 32}, "seq"),
    ({"opcode": 3}, "opcode"),
    ({"opcode": VoqOpcode.CREDIT, "credit_bytes": 1 << 32}, "credit_bytes"),
    ({"credit_bytes": 4096}, "credit_bytes"),        # a pause carries no credit
    ({"opcode": VoqOpcode.CREDIT, "quanta": 10, "credit_bytes": 1}, "quanta"),
    ({"src_mac": "02:00:00:00:0a"}, "MAC address"),
])
def test_voq_frame_refuses_out_of_range_fields(kwargs, bad):
    args = {"src_mac": SRC_MAC, "dst_ip": DST_IP, "priority": 3} | kwargs
    with pytest.raises(ValueError, match=bad):
        voq_frame(**args)


def test_tshark_lua_args_name_the_shipped_dissector():
    assert wire.tshark_lua_args() == ["-X", f"lua_script:{wire.VOQ_DISSECTOR}"]
    assert wire.VOQ_DISSECTOR.is_file()
    text = wire.VOQ_DISSECTOR.read_text()
    assert f"0x{wire.VOQ_ETHERTYPE:04X}" in text and f"VOQ_VERSION = {wire.VOQ_VERSION}" in text


# -- tshark -----------------------------------------------------------------------------
def has_lua(version_text: str) -> bool:
    """Whether `tshark -v` says it was built with Lua (the dissector needs it)."""
    return re.search(r"\bwith Lua\b", version_text) is not None


def tshark_with_lua() -> str | None:
    """Why the tshark tests cannot run here, or None if they can."""
    if shutil.which("tshark") is None:
        return "needs tshark"
    out = subprocess.run(["tshark", "-v"], capture_output=True, text=True, timeout=60)
    return None if has_lua(out.stdout) else "needs a tshark built with Lua"


def test_lua_detection_reads_tshark_version_both_ways():
    built = "Compiled (64-bit) using GCC 12.2.0, with GLib 2.74.6, with zlib 1.2.13, "
    assert has_lua(built + "with libpcap, with Lua 5.2.4, with GnuTLS 3.7.9")
    assert has_lua(built + "with libnl 3, with Lua\n5.2.4, with GnuTLS")
    assert not has_lua(built + "with libpcap, without Lua, with GnuTLS 3.7.9")
    assert not has_lua(built + "with libpcap, with LuaJIT-less build")


NO_LUA = tshark_with_lua()
needs_lua = pytest.mark.skipif(NO_LUA is not None, reason=NO_LUA or "")

PAUSE = voq_frame(SRC_MAC, DST_IP, 3, 0xFFFF, seq=1)
RELEASE = voq_frame(SRC_MAC, DST_IP, 3, 0, seq=2)
CREDIT = voq_frame(SRC_MAC, DST_IP, 3, opcode=VoqOpcode.CREDIT, credit_bytes=4096, seq=3)
PFC = wire.pfc_frame(SRC_MAC, {3: 0xFFFF})
IPV4 = bytes(Ether(src=SRC_MAC, dst="02:00:00:00:00:0b")
             / IP(src="198.18.0.1", dst="198.18.0.2") / UDP(sport=50000, dport=4791))


def tshark_fields(pcap: Path, fields: list[str], shown: str | None = None) -> list[list[str]]:
    argv = ["tshark", "-r", str(pcap), *wire.tshark_lua_args(), "-T", "fields",
            "-E", "separator=|"]
    argv += ["-Y", shown] if shown else []
    out = subprocess.run([*argv, *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "error" not in out.stderr.lower(), out.stderr     # a Lua error says so there
    return [ln.split("|") for ln in out.stdout.splitlines()]


@needs_lua
def test_tshark_decodes_pause_release_and_credit(tmp_path: Path):
    pcap = tmp_path / "voq.pcap"
    wrpcap(str(pcap), [Ether(f) for f in (PAUSE, RELEASE, CREDIT)])
    rows = tshark_fields(pcap, ["aft_voq.version", "aft_voq.opcode", "aft_voq.priority",
                                "aft_voq.dst", "aft_voq.quanta", "aft_voq.credit",
                                "aft_voq.seq", "_ws.col.Protocol"])
    assert rows == [["1", "1", "3", DST_IP, "65535", "0", "1", "AFT-VOQ"],
                    ["1", "1", "3", DST_IP, "0", "0", "2", "AFT-VOQ"],
                    ["1", "2", "3", DST_IP, "0", "4096", "3", "AFT-VOQ"]]


@needs_lua
def test_tshark_filter_selects_only_the_voq_frames_and_says_what_each_does(tmp_path: Path):
    pcap = tmp_path / "mixed.pcap"
    wrpcap(str(pcap), [Ether(f) for f in (IPV4, PAUSE, PFC, RELEASE, CREDIT)])
    assert tshark_fields(pcap, ["frame.number", "_ws.col.Info"], shown="aft_voq") == [
        ["2", f"VOQ pause dst={DST_IP} prio=3 quanta=65535"],
        ["4", f"VOQ release dst={DST_IP} prio=3"],
        ["5", f"credit dst={DST_IP} 4096 B/s"]]
    # the docs' example filter: the pauses that hold a queue, not the releases
    held = tshark_fields(pcap, ["frame.number"], shown="aft_voq.opcode == 1 && aft_voq.quanta > 0")
    assert held == [["2"]]
    # the PFC frame beside them still decodes as PFC
    assert tshark_fields(pcap, ["frame.number"], shown="macc.cbfc.enbv") == [["3"]]


@needs_lua
def test_tshark_flags_an_unknown_version_and_does_not_read_further(tmp_path: Path):
    pcap = tmp_path / "v2.pcap"
    wrpcap(str(pcap), [Ether(patched(PAUSE, 14, b"\x02"))])
    assert tshark_fields(pcap, ["aft_voq.version", "aft_voq.dst", "_ws.col.Info"]) == [
        ["2", "", "VOQ version 2 (unknown)"]]
