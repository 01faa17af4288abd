"""The lossless class at a high fan-in, as a user runs it: a 15:1 incast across two
tiers (the 4 x 4 leaf-spine, 4 hosts a leaf) with PFC on and every default, through
`testbed run`. Root: it builds the fabric."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import fabric.scheduled as switch_choice
from testbed.experiment import from_toml
from testbed.run import run as run_experiment

HAS_TSHARK = shutil.which("tshark") is not None
SPINE_PORT = "spine0-eth3"     # spine0's port towards leaf3, the receiver's leaf
LEAF_PORT = "leaf3-eth4"       # leaf3's port towards spine0: the two ends of one link


def pause_times(pcap: Path, src_mac: str) -> list[str]:
    """The priority-3 pause time of every PFC frame in `pcap` sent by `src_mac`."""
    out = subprocess.run(["tshark", "-r", str(pcap), "-Y",
                          f"macc.cbfc.enbv == 0x0008 && eth.src == {src_mac}", "-T",
                          "fields", "-e", "macc.cbfc.pause_time.c3"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


@pytest.mark.root
@pytest.mark.skipif(not HAS_TSHARK, reason="needs tshark")
def test_a_15_to_1_two_tier_incast_is_lossless(tmp_path: Path, host_untouched):
    exp = from_toml(None, {
        "name": "t_incast15", "workload": "incast", "message_bytes": 256 * 1024,
        "iterations": 1, "pfc": "on", "rate": 10.0, "pcap": [SPINE_PORT, LEAF_PORT],
        "results_dir": str(tmp_path), "timeout_s": 120.0,
        "topology": {"kind": "leaf_spine", "params": {"leaves": 4, "spines": 4,
                                                      "hosts_per_leaf": 4}}})
    folder, metrics = run_experiment(exp)
    rep = json.loads((folder / "pfc.json").read_text())
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    # the run sized the buffers for 7 ingress ports a leaf, and said so
    config = (folder / "config.toml").read_text()
    assert "queue_bytes = 131072" not in config
    assert rep["headroom"]["thresholds_fit"], rep["headroom"]["notes"]
    # lossless: not one frame dropped anywhere, every peak charge inside its headroom
    assert rep["totals"]["drops"] == 0, {k: v for k, v in rep["ports"].items() if v["drops"]}
    assert metrics["flows"]["retransmits"] == 0 and metrics["flows"]["timeouts"] == 0
    assert rep["peaks"]["beyond_headroom"] == []
    # leaf3 paused spine0 over this link: the frames leave leaf3's end (its own MAC) and
    # arrive at spine0's; tshark decodes the same XOFF and XON frames on both captures
    sent = rep["ports"][f"leaf3:{LEAF_PORT}"]
    assert sent["xoff_frames"] > 0
    assert rep["ports"][f"spine0:{SPINE_PORT}"]["frames_received"] == sent["frames_sent"]
    leaf_mac = subprocess.run(["tshark", "-r", str(folder / "pcaps" / f"{LEAF_PORT}.pcap"),
                               "-Y", "macc.cbfc.enbv", "-T", "fields", "-e", "eth.src"],
                              capture_output=True, text=True, timeout=60,
                              check=True).stdout.split()[0]
    for port in (LEAF_PORT, SPINE_PORT):
        times = pause_times(folder / "pcaps" / f"{port}.pcap", leaf_mac)
        assert times.count("65535") == sent["xoff_frames"], port
        assert times.count("0") == sent["xon_frames"], port
    # the lossless class held, and at 10 Mbit/s the emulator keeps up: faithful, unless
    # something else saturates the machine (CPU >= 90 %), where the load's own figures
    # (shaping timers, starvation) may grade it down; the lossless grade never does
    fid = metrics["fidelity"]
    assert fid["grades"]["lossless"] == "faithful", fid["reasons"]
    saturated = (fid["figures"].get("cpu_mean_percent") or 0) >= 90
    assert fid["verdict"] == "faithful" or saturated, fid


@pytest.mark.root
def test_a_lossless_drop_the_emulator_caused_is_not_faithful(tmp_path: Path, host_untouched,
                                                             monkeypatch):
    """The PFC controller stopped (SIGSTOP) from its start until the agents are done: a
    3:1 incast fills its receiver's port with nothing paused and drops, though the buffers
    fit every threshold. The run must say the emulator failed, not faithful. (Stopped for
    the whole workload, whatever the machine's speed: a stop of a fixed time can end
    before a slow machine's agents send their first frame.)"""
    real = switch_choice.controller_running      # what switches_running starts for PFC
    resumed: list[int] = []

    @contextlib.contextmanager
    def stalled(*args, **kwargs):
        with real(*args, **kwargs) as ctl:
            os.kill(ctl.pid, signal.SIGSTOP)
            try:
                yield ctl
            finally:      # the run leaves the block when its agents are done
                os.kill(ctl.pid, signal.SIGCONT)
                resumed.append(ctl.pid)

    monkeypatch.setattr(switch_choice, "controller_running", stalled)
    exp = from_toml(None, {
        "name": "t_stalled", "workload": "incast", "message_bytes": 1 << 20,
        "iterations": 1, "pfc": "on", "rate": 25.0, "results_dir": str(tmp_path),
        "timeout_s": 120.0, "topology": {"kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 2}}})
    folder, metrics = run_experiment(exp)
    assert len(resumed) == 1
    rep = json.loads((folder / "pfc.json").read_text())
    assert metrics["flows"]["exactly_once"]               # go-back-N recovered them
    assert rep["headroom"]["thresholds_fit"] and rep["totals"]["drops"] > 0
    assert rep["headroom"]["verdict"] == "exceeded"
    fid = metrics["fidelity"]
    assert fid["verdict"] == "unfaithful" and fid["grades"]["lossless"] == "unfaithful"
    assert any("lossless drops with PFC on" in r for r in fid["reasons"]), fid["reasons"]
    assert "**unfaithful**" in (folder / "summary.md").read_text()
