"""Packet trimming (fabric.trimming): the switch program in this kernel, the UET receiver's
NAK and the sender's resend, and on a real fabric a trimmed packet recovered without a
timeout."""

from __future__ import annotations

import struct
import subprocess

import pytest

from fabric.lossless import SwitchSettings
from fabric.trimming import TRIM_DSCP, TRIMMED_FRAME_BYTES, Trim, trimmed_frame_ok
from testbed.experiment import from_toml
from topologies.physics import ROCE_FRAME_BYTES
from topologies.spec import SpecError
from traffic.transport import NO_ACTION, SEND_NAK, SYNDROME_NAK_SEQ, make_receiver, make_sender
from traffic.transport_settings import TransportParams


def test_settings_name_the_key_and_bring_the_counted_class_and_need_uet():
    s = SwitchSettings(pfc="off", trimming="on")
    assert s.trim_at(131072) == Trim(131072 - ROCE_FRAME_BYTES)      # one frame less
    assert SwitchSettings(pfc="off").trim_at(131072) is None
    assert SwitchSettings(pfc="off", trimming="on", trim_threshold_bytes=9000).trim_at(1) == \
        Trim(9000)
    with pytest.raises(SpecError, match="trimming.*off, on"):
        SwitchSettings(pfc="off", trimming="yes")
    assert SwitchSettings(trimming="on").trim_at(131072) == Trim(131072 - ROCE_FRAME_BYTES)
    assert from_toml(None, {"transport": "uet", "trimming": "on"}).switch_settings().mode == "off"
    with pytest.raises(SpecError, match="trim_threshold_bytes.*above 70"):
        SwitchSettings(pfc="off", trimming="on", trim_threshold_bytes=64)
    with pytest.raises(SpecError, match='experiment.trimming.*transport = "uet"'):
        from_toml(None, {"transport": "roce", "pfc": "off", "trimming": "on"})
    with pytest.raises(ValueError, match="trim threshold"):
        Trim(10)


def _params(**kw) -> TransportParams:
    return TransportParams(**{"window_packets": 8, "ack_every": 4, **kw})


def test_uet_receiver_naks_a_trimmed_psn_at_once_unless_it_arrived_whole():
    rx = make_receiver("uet", 10 * 1000, 1000, _params())
    assert rx.on_data(0, False) == NO_ACTION
    assert rx.on_trimmed(3) == SEND_NAK
    syndrome, psn, base, bitmap = rx.ack_fields(SEND_NAK)
    assert (syndrome, psn, base, bitmap) == (SYNDROME_NAK_SEQ, 3, 1, 0)
    assert rx.on_trimmed(0) == NO_ACTION           # a whole copy was delivered already
    assert rx.on_trimmed(10) == NO_ACTION and rx.bad_packets == 1
    assert rx.trimmed == 2 and rx.naks == 1
    for p in range(1, 10):
        rx.on_data(p, False)
    assert rx.exactly_once                          # a trimmed packet delivers nothing


def test_uet_sender_resends_a_naked_psn_first_and_only_once():
    tx = make_sender("uet", 10, _params())
    sent = [tx.take(0) for _ in range(8)]
    assert sent == list(range(8)) and tx.take(0) == -1
    tx.on_ack(1, SYNDROME_NAK_SEQ, 2, 2, 0b10)      # 0, 1, 3 arrived; 2 was trimmed
    assert tx.naks == 1 and tx.take(2) == 2 and tx.retransmits == 1
    tx.on_ack(3, SYNDROME_NAK_SEQ, 2, 2, 0b10)      # the same NAK again: resent already?
    assert tx.take(4) == 2 and tx.retransmits == 2  # no: a NAK names a lost transmission
    tx.on_ack(5, SYNDROME_NAK_SEQ, 1, 3, 0)         # an acknowledged PSN: nothing to do
    assert tx.take(6) == 8 and tx.retransmits == 2
    assert tx.timeouts == 0


def _uet_frame(*, tos: int = (26 << 2) | 2, opcode: int = 0x04, dqpn: int = 0x800005,
               payload: int = 1000) -> bytes:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    bth = struct.pack(">BBHB", opcode, 0, 0xFFFF, 0) + dqpn.to_bytes(3, "big") + \
        struct.pack(">I", 0x80000007)
    body = bth + bytes(range(16)) + bytes(payload) + b"ICRC"
    return bytes(Ether() / IP(tos=tos) / UDP(sport=49152, dport=4791, chksum=0) / body)


@pytest.mark.root
def test_switch_program_trims_only_uet_data_that_would_pass_the_threshold():
    """The counter's egress program with trimming, run in this kernel (BPF_PROG_TEST_RUN):
    map entries 0 in, 1 out, 2 (dropped, marks), 3 (trimmed bytes, frames)."""
    from fabric.libbpf import test_run
    from fabric.queue_counters import hook_config, scratch_hook
    with scratch_hook(4, hook_config(0, 26, trim=(2, 3, Trim(50_000)))) as (prog, v):
        def run_once(frame: bytes, queued: int, dropped: int = 0) -> bytes:
            v[0], v[2], v[4] = queued, 0, dropped
            rc, out = test_run(prog, frame)
            assert rc == -1
            return out

        uet = _uet_frame()
        out = run_once(uet, 50_000 - len(uet) + 1)   # one byte over: trimmed
        assert trimmed_frame_ok(out) is None, trimmed_frame_ok(out)
        assert out[15] & 3 == 2                       # ECN bits kept (ECT(0))
        assert out[42:70] == uet[42:70]               # BTH and stamp as they were
        assert v[0] == 50_000 - len(uet) + 1 and v[1] == 0   # not counted into the queue
        assert (v[6], v[7]) == (len(uet), 1)         # counted as trimmed
        assert run_once(uet, 50_000 - len(uet)) == uet and v[0] == 50_000 and v[7] == 1
        assert run_once(uet, 60_000, dropped=20_000) == uet     # drops are not queued
        for whole in (_uet_frame(dqpn=0x000005),              # RoCE (RC): never
                      _uet_frame(opcode=0x11),                # a UET ACK: never
                      _uet_frame(tos=(46 << 2) | 2),          # not the lossless class
                      _uet_frame(payload=16)[:70]):           # nothing to cut
            assert run_once(whole, 1 << 30) == whole
        assert v[7] == 1
        ce = run_once(_uet_frame(tos=(26 << 2) | 3), 1 << 30)
        assert trimmed_frame_ok(ce) is None and ce[15] & 3 == 3 and v[7] == 2


def _trimmed_in_pcap(pcap) -> list[tuple[int, int]]:
    out = subprocess.run(["tshark", "-r", str(pcap), "-Y", f"ip.dsfield.dscp == {TRIM_DSCP}",
                          "-T", "fields", "-e", "frame.len", "-e", "infiniband.bth.psn"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [(int(a), int(b)) for a, b in (line.split("\t") for line in out.stdout.splitlines()
                                           if line.strip())]


@pytest.mark.root
def test_trimmed_packets_are_naked_and_resent_without_a_timeout(tmp_path, host_untouched):
    """4:1 UET incast without PFC into a 64 KiB queue: the switch trims instead of
    dropping, every trimmed frame is on the wire (70 B, DSCP 46, tshark decodes its BTH)
    and reaches the receiver, which NAKs it; the senders resend; no RTO fires (it is 5 s,
    so only a lost trimmed frame or NAK could make one), every byte arrives once."""
    from testbed.run import run
    exp = from_toml(None, {
        "name": "t_trim", "workload": "incast", "message_bytes": 1 << 20, "iterations": 1,
        "transport": "uet", "entropy": "spray", "pfc": "off", "trimming": "on",
        "window_packets": 32, "rto_ms": 5000.0, "results_dir": str(tmp_path),
        "timeout_s": 120.0, "topology": {"kind": "one_tier", "params": {
            "nodes": 5, "planes": 1, "queue_bytes": 65536}}})
    port = exp.resolve_topology().ifname("plane0", "cpu4")
    exp.pcap = [port]
    folder, m = run(exp)
    f, trim = m["flows"], m["pfc"]["trimming"]
    assert f["exactly_once"] and f["timeouts"] == 0
    assert m["links"]["drops"] == 0             # trimmed below the queue's limit: no loss
    assert trim["enabled"] and trim["mechanism"].startswith("tc clsact eBPF")
    assert trim["trimmed"] > 0 and set(trim["trimmed_by_port"]) == {f"plane0:{port}"}
    # the trimmed frames travel in the control class, served first: none is lost
    assert f["trimmed"] == trim["trimmed"]
    assert 0 < f["naks"] <= f["trimmed"] and f["retransmits"] >= f["naks"]
    wire = _trimmed_in_pcap(folder / "pcaps" / f"{port}.pcap")
    assert len(wire) == trim["trimmed"] and {n for n, _ in wire} == {TRIMMED_FRAME_BYTES}
    summary = (folder / "summary.md").read_text()
    assert f"{trim['trimmed']} frames trimmed" in summary and "dscp == 46" in summary
