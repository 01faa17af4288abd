"""VXLAN links (fabric.vxlan): the underlay MTU they need, and what crosses them on the
wire: a full RoCE packet with DF set and its traffic class on the outer header, and a PFC
frame as the frame it is."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric import netns
from fabric.vxlan import (
    INNER_ADDRESSES,
    ROCE_IP_BYTES,
    VXLAN_OVERHEAD_BYTES,
    check_underlay_mtu,
    inner_mtu,
    scratch_pair,
)
from fabric.wire import pfc_frame
from topologies.spec import MTU_BYTES, SpecError

ROOT = Path(__file__).resolve().parent.parent


def test_the_underlay_must_carry_a_full_roce_packet_plus_50_bytes():
    assert VXLAN_OVERHEAD_BYTES == 14 + 20 + 8 + 8
    assert ROCE_IP_BYTES == 20 + 8 + 12 + 16 + 4096 + 4
    assert inner_mtu(9050) == MTU_BYTES == check_underlay_mtu("u", 9050)
    assert inner_mtu(65535) == MTU_BYTES                  # capped at the fabric's own
    assert check_underlay_mtu("u", ROCE_IP_BYTES + 50) == ROCE_IP_BYTES
    with pytest.raises(SpecError) as err:
        check_underlay_mtu("cluster.servers[1].underlay", 1500)
    text = str(err.value)
    assert text.startswith("cluster.servers[1].underlay: MTU 1500 B carries 1450 B")
    assert f"set the underlay's MTU to {ROCE_IP_BYTES + 50} or more" in text
    with pytest.raises(SpecError):
        check_underlay_mtu("u", ROCE_IP_BYTES + 49)


def capture(ns: str, ifname: str, pcap: Path) -> subprocess.Popen:
    with netns.entered(ns):
        proc = subprocess.Popen(["tcpdump", "-i", ifname, "-w", str(pcap), "-U", "-n",
                                 "--immediate-mode"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = proc.stderr.readline().decode()
    assert "listening on" in line, line
    return proc


@pytest.mark.root
def test_a_roce_packet_and_a_pfc_frame_cross_a_vxlan_link_as_they_are(tmp_path,
                                                                       host_untouched):
    with scratch_pair("vxtest") as (ns_a, ns_b):
        outer = capture(ns_b, "ul-b", tmp_path / "underlay.pcap")
        inner = capture(ns_b, "vx-b", tmp_path / "inner.pcap")
        with netns.entered(ns_b):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with netns.entered(ns_a):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        with rx, tx, raw:
            rx.bind(("0.0.0.0", 4791))
            rx.settimeout(10)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 26 << 2)     # DSCP 26
            payload = bytes(range(256)) * 16 + bytes(32)                  # 4,128 B
            deadline = time.monotonic() + 10
            got = b""
            while not got and time.monotonic() < deadline:               # ARP first
                tx.sendto(payload, (INNER_ADDRESSES[1], 4791))
                try:
                    got = rx.recv(65536)
                except TimeoutError:
                    pass
            assert got == payload
            raw.bind(("vx-a", 0))
            raw.send(pfc_frame("02:00:00:00:00:0a", {3: 0xFFFF}))
            time.sleep(0.5)
        for proc in (outer, inner):       # SIGTERM: tcpdump writes what it has and ends
            proc.terminate()
            proc.wait(timeout=10)

    def fields(pcap: Path, shown: str, *names: str) -> list[list[str]]:
        out = subprocess.run(["tshark", "-r", str(pcap), "-Y", shown, "-T", "fields",
                              *[a for n in names for a in ("-e", n)]],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return [ln.split("\t") for ln in out.splitlines() if ln]

    # on the underlay: UDP 4789, VNI 1, DF set, the inner DSCP on the outer header, and a
    # 4,156 B inner IP packet in one outer packet of 4,206 B
    (roce,) = fields(tmp_path / "underlay.pcap", "vxlan && udp.dstport == 4791",
                     "vxlan.vni", "ip.flags.df", "ip.dsfield.dscp", "ip.len")
    assert roce[0] == "1"
    assert roce[1].split(",")[0] in ("1", "True")                # the outer header's DF
    assert roce[2].split(",")[0] == "26"
    assert [int(n) for n in roce[3].split(",")] == [ROCE_IP_BYTES + 50, ROCE_IP_BYTES]
    assert fields(tmp_path / "underlay.pcap", "vxlan && macc.cbfc.enbv",
                  "macc.cbfc.pause_time.c3") == [["65535"]]
    # out of the far port: the PFC frame as sent (a bridge would have dropped its address)
    assert fields(tmp_path / "inner.pcap", "macc.cbfc.enbv && eth.dst == 01:80:c2:00:00:01",
                  "macc.cbfc.enbv", "macc.cbfc.pause_time.c3") == [["0x0008", "65535"]]
    assert not netns.named("vxtest")


@pytest.mark.root
def test_bench_vxlan_smoke(tmp_path, host_untouched):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "scripts/bench_vxlan.py", "--packets", "20000",
                           "--rounds", "1", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    assert got["cluster_vxlan_us_per_packet"] > 0 and got["cluster_veth_us_per_packet"] > 0
    assert "calibration_budget_pps_direct" in got or "calibration" in got
    assert "VXLAN costs" in proc.stdout and not netns.named("vxbench")
