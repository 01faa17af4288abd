"""`testbed run`: a results folder a user can read, plot and open in Wireshark."""

from __future__ import annotations

import contextlib
import csv
import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from scapy.utils import rdpcap

from fabric import netns
from fabric.addressing import plan
from fabric.clean import leftovers
from testbed.experiment import from_toml
from testbed.run import run
from traffic.packets import ROCE_UDP_PORT, Opcode, icrc_of, wire_icrc
from traffic.parse import parse

from .conftest import sigint_as_in_a_terminal, wait_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.root


def _experiment(tmp_path, **overrides):
    settings = {"name": "t_run", "workload": "allreduce", "message_bytes": 256 * 1024,
                "iterations": 2, "results_dir": str(tmp_path), "timeout_s": 60.0,
                "rto_ms": 200.0, "topology": {"kind": "leaf_spine", "params": {
                    "leaves": 2, "spines": 2, "hosts_per_leaf": 2}}}
    settings.update(overrides)
    return from_toml(None, settings)


def test_run_writes_a_complete_results_folder(tmp_path, host_untouched):
    exp = _experiment(tmp_path, pcap=["leaf0-eth0"])
    folder, metrics = run(exp)
    for name in ("config.toml", "metrics.json", "flows.csv", "links.csv", "cpu.csv",
                 "latency.csv", "summary.md", "plots/latency_cdf.png",
                 "plots/port_rates.png", "pcaps/leaf0-eth0.pcap"):
        assert (folder / name).stat().st_size > 0, name
    assert not (folder / "FAILED").exists()
    assert folder.name.startswith("t_run-")
    for png in (folder / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((folder / "metrics.json").read_text())
    assert saved["ok"] and len(saved["iterations"]) == 2
    # every byte of every rank's chunks arrived exactly once
    assert saved["flows"]["exactly_once"]
    assert saved["flows"]["bytes_delivered"] == saved["flows"]["bytes_expected"] == \
        2 * 4 * 2 * 3 * (256 * 1024 // 4)
    # the summary states the measured numbers
    summary = (folder / "summary.md").read_text()
    assert f"JCT mean {saved['jct_mean_s']:.3f} s" in summary
    assert "Avg bus bandwidth" in summary
    # config.toml is what ran, and runs again
    config = tomllib.loads((folder / "config.toml").read_text())
    assert config["experiment"]["seed"] == 1 and config["topology"]["kind"] == "leaf_spine"
    assert from_toml(folder / "config.toml").workload == "allreduce"
    # the pcap holds RoCEv2 frames with valid ICRCs, decoded by tshark as InfiniBand
    frames = [bytes(p) for p in rdpcap(str(folder / "pcaps" / "leaf0-eth0.pcap"))]
    roce = [f for f in frames if len(f) > 1000 and
            int.from_bytes(f[36:38], "big") == ROCE_UDP_PORT]
    assert roce and all(icrc_of(f) == wire_icrc(f) for f in roce)
    out = subprocess.run(["tshark", "-r", str(folder / "pcaps" / "leaf0-eth0.pcap"), "-T",
                          "fields", "-e", "infiniband.bth.opcode", "-c", "50"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and any(line.strip() for line in out.stdout.splitlines())
    assert metrics["cpu"]["cores"] >= 1
    # report re-plots the folder from its own files and writes the same summary
    (folder / "plots" / "latency_cdf.png").unlink()
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (folder / "plots" / "latency_cdf.png").stat().st_size > 0
    assert (folder / "summary.md").read_text() == summary


def test_a_runs_pcap_holds_every_packet_up_to_its_last(tmp_path, host_untouched):
    """A short run (well under the second libpcap may hold frames for) still has its last
    data packets in the pcap: every byte the sender sent, counted once."""
    exp = _experiment(tmp_path, workload="p2p", pairs=["l0h0>l1h0"], iterations=1,
                      message_bytes=1 << 20, pcap=["l0h0-eth0"], rate=50.0)
    folder, metrics = run(exp)
    assert metrics["flows"]["exactly_once"]
    rank_ip = plan(exp.resolve_topology()).loopback["l0h0"].split("/")[0]
    sent = {}
    for p in rdpcap(str(folder / "pcaps" / "l0h0-eth0.pcap")):
        with contextlib.suppress(ValueError):         # not RoCEv2: ARP, ICMP
            pkt = parse(bytes(p))
            if pkt["opcode"] != Opcode.RC_ACK and pkt["src"] == rank_ip:
                sent[(pkt["dqpn"], pkt["msg_id"], pkt["offset"])] = pkt["payload_bytes"]
    assert sum(sent.values()) == 1 << 20


def test_spray_evens_spine_load_that_ecmp_leaves_uneven(tmp_path, host_untouched):
    base = {"workload": "p2p", "message_bytes": 2 << 20, "iterations": 1,
            "topology": {"kind": "leaf_spine", "params": {"leaves": 2, "spines": 4,
                                                          "hosts_per_leaf": 4}}}
    _, ecmp = run(_experiment(tmp_path, name="t_ecmp", entropy="ecmp", transport="uet",
                              **base))
    _, spray = run(_experiment(tmp_path, name="t_spray", entropy="spray", transport="uet",
                               **base))
    assert ecmp["flows"]["exactly_once"] and spray["flows"]["exactly_once"]
    assert spray["links"]["uplink_max_over_mean"] < 1.25, spray["links"]
    assert ecmp["links"]["uplink_max_over_mean"] > spray["links"]["uplink_max_over_mean"] + 0.2


def test_cli_run_bad_input_exits_2_and_builds_nothing(tmp_path, host_untouched):
    for args, field in ((["--workload", "allscatter"], "--workload"),      # argparse's choices
                        (["--topology", "full_mesh", "--set", "nodes=0"], "nodes"),
                        (["--ranks", "99", "--topology", "full_mesh"], "experiment.ranks")):
        out = subprocess.run([sys.executable, "-m", "testbed", "run", "--results",
                              str(tmp_path), *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert field in out.stderr
    assert list(tmp_path.iterdir()) == [] or all(
        (p / "FAILED").exists() for p in tmp_path.iterdir())
    assert netns.ours("") == []


def test_ctrl_c_during_a_run_marks_failed_and_leaves_nothing(tmp_path, host_untouched):
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "--topology", "one_tier",
                             "--workload", "alltoall", "--message-bytes", str(64 << 20),
                             "--results", str(tmp_path), "--timeout", "120"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        assert wait_for(lambda: list(tmp_path.glob("*/agents/*.config.json")), timeout_s=60)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    (folder,) = tmp_path.iterdir()
    assert "interrupted" in (folder / "FAILED").read_text()
    lab = f"run{proc.pid}"  # the runner builds its fabric under this lab
    assert wait_for(lambda: leftovers(lab) == 0, timeout_s=10)
    assert netns.ours(lab) == []


def test_run_with_loss_and_a_link_failure(tmp_path, host_untouched):
    exp = _experiment(tmp_path, name="t_loss", workload="p2p", transport="roce",
                      message_bytes=1 << 20, iterations=1, loss_rate=0.01,
                      failures=[{"link": "leaf0:spine0", "at_s": 0.02, "repair_s": 0.2}])
    folder, m = run(exp)
    assert m["ok"] and m["flows"]["exactly_once"]
    assert m["flows"]["retransmits"] > 0                  # go-back-N recovered the losses
    physics = m["link_physics"]
    assert physics["mechanisms"]["loss"] in ("netem", "nftables")
    assert physics["mechanisms"]["delay"] == "off" and physics["path_delay_ms"] is None
    assert [e["action"] for e in physics["events"]][:2] == ["fail_link", "repair_link"]
    assert all(link["up"] for link in physics["links"])   # repaired by the end
    assert m["link_energy"]["run"]["energy_j"] > 0
    assert "link physics: loss by" in (folder / "summary.md").read_text()


def test_reach_violation_is_refused_before_building(tmp_path, host_untouched):
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "--topology", "leaf_spine",
                          "--set", "tech=copper", "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "links.leaf0:spine0.length_m" in out.stderr and "reach" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_run_with_pfc_on_and_off(tmp_path, host_untouched):
    base = {"workload": "incast", "message_bytes": 1 << 20, "iterations": 1,
            "transport": "roce", "topology": {"kind": "leaf_spine", "params": {
                "leaves": 2, "spines": 1, "hosts_per_leaf": 3}}}
    folder_on, on = run(_experiment(tmp_path, name="t_pfc_on", pfc="on", **base))
    folder_off, off = run(_experiment(tmp_path, name="t_pfc_off", pfc="off", **base))
    assert on["flows"]["exactly_once"] and off["flows"]["exactly_once"]
    assert on["pfc"]["enabled"] and on["pfc"]["totals"]["frames_sent"] > 0
    assert on["pfc"]["totals"]["paused_s"] > 0
    assert off["pfc"]["totals"]["frames_sent"] == 0
    assert off["pfc"]["totals"]["drops"] > on["pfc"]["totals"]["drops"]   # PFC prevents loss
    # the run's fabric drops count the lossless queues' drops too
    assert off["links"]["drops"] >= off["pfc"]["totals"]["drops"] > 0
    assert off["flows"]["retransmits"] > 0                 # ... which go-back-N must recover
    assert (folder_on / "pfc.json").exists() and (folder_on / "pfc_timeline.csv").exists()
    assert "pause frames sent" in (folder_on / "summary.md").read_text()
    # the lossless class is graded with PFC on only: the lossy class's drops are physics
    assert on["fidelity"]["figures"]["lossless_drops"] == on["pfc"]["totals"]["drops"]
    assert "lossless" in on["fidelity"]["grades"] and "lossless" not in off["fidelity"]["grades"]
    assert "; lossless drops " in (folder_on / "summary.md").read_text()
    # no pause, no time "paused by PFC": a queue that waited with PFC off was not paused
    with open(folder_off / "flows.csv") as fh:
        split = [r for r in csv.DictReader(fh) if r["paused_s"]]
    assert split and all(float(r["paused_s"]) == 0.0 for r in split)
    assert "paused by PFC" not in (folder_off / "summary.md").read_text()


def test_report_redraws_every_plot_and_writes_only_inside_the_folder(tmp_path,
                                                                      host_untouched):
    """A run with PFC, ECN and DCQCN draws every kind of plot but the training step's;
    report draws them all again from the folder's files, keeps a FAILED verdict, never
    writes through a link, and a damaged file is one line and exit 2."""
    folder, _ = run(_experiment(tmp_path, name="t_report", workload="incast",
                                message_bytes=1 << 20, iterations=1, pfc="on", ecn="on",
                                cc="dcqcn", topology={"kind": "leaf_spine", "params": {
                                    "leaves": 2, "spines": 1, "hosts_per_leaf": 3}}))
    drawn = sorted(p.name for p in (folder / "plots").glob("*.png"))
    assert {"pfc_backlog_bytes.png", "dcqcn_rates.png", "port_rates.png",
            "flow_time_split.png", "latency_cdf.png"} <= set(drawn), drawn
    summary = (folder / "summary.md").read_text()
    for png in (folder / "plots").glob("*.png"):
        png.unlink()
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (folder / "plots").glob("*.png")) == drawn
    assert (folder / "summary.md").read_text() == summary
    # a link in the folder is replaced, never written through; plots leading out: refused
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.md").write_text("keep me")
    (folder / "summary.md").unlink()
    (folder / "summary.md").symlink_to(outside / "victim.md")
    (folder / "FAILED").write_text("interrupted (Ctrl-C)\n")
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (outside / "victim.md").read_text() == "keep me"
    assert not (folder / "summary.md").is_symlink()
    assert "result: FAILED" in (folder / "summary.md").read_text()     # the run's verdict
    (folder / "plots").rename(tmp_path / "plots_elsewhere")
    (folder / "plots").symlink_to(outside)
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "folder:" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["victim.md"]
    (folder / "plots").unlink()
    (tmp_path / "plots_elsewhere").rename(folder / "plots")
    for name, damage in (("flows.csv", b"\x00\xff" * 500), ("metrics.json", b"[1, 2]"),
                         ("links.csv", b"t_s,node\n1,a\n")):
        good = (folder / name).read_bytes()
        (folder / name).write_bytes(damage)
        out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "folder:" in lines[0], out.stderr
        (folder / name).write_bytes(good)
    (folder / "flows.csv").unlink()
    out = subprocess.run([sys.executable, "-m", "testbed", "report", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no flows.csv" in out.stderr


def test_propagation_delay_holds_every_packet_its_paths_delay(tmp_path, host_untouched):
    """`delay = "on"`: a packet reaches its receiver no sooner than the path's one-way
    delay after it left, and an acknowledged message takes at least a round trip, with
    netem or the agents' delay line; nothing is lost or duplicated on the way."""
    # l0h0 - leaf0 - spine - leaf1 - l1h0: 2 + 30 + 30 + 2 m, 5 ns/m, x4000
    one_way_ns = (2 + 30 + 30 + 2) * 5 * 4000
    exp = _experiment(tmp_path, name="t_delay", workload="p2p", delay="on",
                      pairs=["l0h0>l1h0", "l1h1>l0h1"], message_bytes=8 * 1024,
                      payload_bytes=1024, iterations=3)
    folder, m = run(exp)
    # nothing lost (no drop, no PSN gap: no NAK), reordered or duplicated; a resend may
    # only follow a timeout, which a stalled machine can fire (a VM under software
    # emulation resent the 7 packets in flight once in 6 runs, lost nothing)
    counts = m["flows"]
    assert m["ok"] and counts["exactly_once"] and m["links"]["drops"] == 0, counts
    assert counts["naks"] == 0 and counts["ooo_packets"] == 0, counts
    assert counts["retransmits"] == 0 or counts["timeouts"] > 0, counts
    physics = m["link_physics"]
    assert physics["mechanisms"]["delay"] in ("netem", "agent delay line")
    if physics["mechanisms"]["delay"] == "agent delay line":
        # over every pair of ranks: across the spine, and within a leaf (2 + 2 m)
        assert physics["path_delay_ms"]["max"] == one_way_ns / 1e6
        assert physics["path_delay_ms"]["min"] == (2 + 2) * 5 * 4000 / 1e6
    assert f"delay {physics['mechanisms']['delay']}" in (folder / "summary.md").read_text()
    flows = [f for a in folder.glob("agents/agent-*.json") if ".config." not in a.name
             for f in json.loads(a.read_text())["flows"]]
    sent = {(f["tag"], f["iteration"]): f for f in flows if f["role"] == "send"}
    got = {(f["tag"], f["iteration"]): f for f in flows if f["role"] == "recv"}
    assert len(sent) == len(got) == 6
    for key, s in sent.items():
        # 1 KiB frames cross 4 hops in ~0.4 ms: without the delay, well under one_way_ns
        assert got[key]["start_ns"] - s["start_ns"] >= one_way_ns, key
        assert s["end_ns"] - s["start_ns"] >= 2 * one_way_ns, key



def test_ecn_marks_ce_at_the_congested_port_and_the_pcap_shows_it(tmp_path, host_untouched):
    """Incast with ECN alone (no pfc key: ECN brings the lossless class, unpaused): the
    switch port into the receiver marks CE once its queue passes kmin; tshark decodes the
    marks in that port's capture, no more of them than the switches counted (a frame may
    be marked on an uplink before)."""
    base = {"workload": "incast", "message_bytes": 1 << 20, "iterations": 1,
            "transport": "roce", "topology": {"kind": "leaf_spine", "params": {
                "leaves": 2, "spines": 1, "hosts_per_leaf": 3}}}
    exp = _experiment(tmp_path, name="t_ecn", ecn="on", **base)
    assert exp.pfc == "" and exp.switch_settings().mode == "off"
    port = exp.resolve_topology().ifname("leaf1", "l1h2")     # into the incast receiver
    exp.pcap = [port]
    folder, m = run(exp)
    assert m["flows"]["exactly_once"] and not m["pfc"]["enabled"]     # never paused
    assert m["pfc"]["totals"].get("frames_sent", 0) == 0
    ecn = m["pfc"]["ecn"]
    assert ecn["enabled"] and ecn["mechanism"].startswith("tc clsact eBPF")
    marks = ecn["marks_by_port"].get(f"leaf1:{port}", 0)
    assert marks > 0
    out = subprocess.run(["tshark", "-r", str(folder / "pcaps" / f"{port}.pcap"), "-Y",
                          "ip.dsfield.ecn == 3", "-T", "fields", "-e", "ip.dsfield.dscp"],
                         capture_output=True, text=True, timeout=120)
    ce = [line for line in out.stdout.splitlines() if line.strip()]
    assert out.returncode == 0 and 0 < len(ce) <= ecn["marks"]
    assert set(ce) == {"26"}                              # the lossless class only
    assert "frames marked CE" in (folder / "summary.md").read_text()
