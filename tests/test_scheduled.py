"""The credit-scheduled fabric (voq = "scheduled", fabric.scheduled): its settings; and, as
root, an all-to-all that it delivers exactly once with no drop, no pause and the spines'
queues short, its credit frames decoded by tshark, and the refusal where the eBPF
counters it reads are off."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fabric.addressing import plan
from fabric.lossless import SwitchSettings
from fabric.scheduled import ScheduledController
from fabric.switch_ports import ControllerTuning
from fabric.voq_control import voq_controller_running
from fabric.wire import tshark_lua_args
from testbed.experiment import from_toml
from testbed.voq_fabric import spine_queue_p99_bytes
from topologies import leaf_spine
from topologies.spec import SpecError


def test_scheduled_needs_spraying_and_brings_pfc():
    with pytest.raises(SpecError, match='experiment.entropy: voq "scheduled" sprays'):
        from_toml(None, {"name": "x", "voq": "scheduled"})
    with pytest.raises(SpecError, match="experiment.voq: 'scheduled' pauses"):
        from_toml(None, {"name": "x", "voq": "scheduled", "pfc": "off", "entropy": "spray",
                         "transport": "uet"})
    exp = from_toml(None, {"name": "x", "voq": "scheduled", "entropy": "spray",
                           "transport": "uet"})
    assert exp.switch_settings().enabled and exp.switch_settings().voq == "scheduled"
    with pytest.raises(SpecError, match="experiment.voq: 'x' is not one of off, on, scheduled"):
        from_toml(None, {"name": "x", "voq": "x"})


def test_a_rate_written_into_an_encoded_tbf_change_decodes_as_encoded_afresh():
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    from fabric.lossless import TbfRate, tbf_message

    def parms(msg: bytes) -> dict:
        m = tcmsg(msg)
        m.decode()
        return m.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")

    t = TbfRate(7, "101:", "1:101", 8220, 400_000)
    for rate in (4000, 123_456, 12_250_000):
        got, fresh = parms(t.message(rate)), parms(tbf_message(
            7, {"rate": rate, "burst": 8220, "limit": 400_000}, "101:", "1:101"))
        assert got["rate"] == fresh["rate"] == rate and got["limit"] == 400_000
        # the bucket's time at that rate, never shorter than pyroute2's (a frame fits)
        assert fresh["buffer"] <= got["buffer"] <= fresh["buffer"] * 1.001 + 8
        assert got["rate___reserved"] == 1          # linklayer Ethernet: no rate table read


@pytest.mark.root
def test_a_written_rate_is_the_kernels(fabric):
    from fabric.lossless import TbfRate, install, voq_class, voq_handle
    from fabric.qdisc_poller import QdiscPoller
    from fabric.shaping import handle_int

    fab = fabric(leaf_spine(leaves=1, spines=1, hosts_per_leaf=3))
    install(fab, SwitchSettings(voq="on").traffic_class, voq=True)
    with fab.ipr("l0h0") as ipr:
        (index,) = ipr.link_lookup(ifname="l0h0-eth0")
    from fabric import netns
    with netns.entered(fab.ns("l0h0")):
        poller = QdiscPoller(handle_int("13:"))
    try:
        t = TbfRate(index, voq_handle(1), voq_class(1), 8220, 300_000)
        poller.request(t.message(777_777))
    finally:
        poller.close()
    with fab.ipr("l0h0") as ipr:
        (q,) = [q for q in ipr.get_qdiscs(index=index) if q["handle"] == handle_int(
            voq_handle(1))]
    got = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
    assert got["rate"] == 777_777 and got["limit"] == 300_000


@pytest.mark.root
def test_without_the_ebpf_counters_it_says_why(fabric):
    fab = fabric(leaf_spine(leaves=2, spines=1, hosts_per_leaf=1))
    settings = SwitchSettings(voq="scheduled")
    with pytest.raises(Exception, match="the eBPF counters"), voq_controller_running(
            fab, settings, ControllerTuning(kernel_counters=False),
            controller=ScheduledController):
        pass


@pytest.mark.root
def test_an_alltoall_goes_through_on_credits_alone(host_untouched, tmp_path: Path):
    from testbed.run import run
    port = "leaf0-eth0"                  # leaf0's port toward l0h0: its grants leave here
    exp = from_toml(None, {
        "name": "scheduled", "workload": "alltoall", "message_bytes": 1_000_000,
        "iterations": 1, "transport": "uet", "entropy": "spray", "voq": "scheduled",
        "nic_queues": "destination", "ack_class": "control", "rate": 10.0,
        "results_dir": str(tmp_path), "timeout_s": 120.0, "rto_ms": 200.0, "pcap": [port],
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 2, "hosts_per_leaf": 2}}})
    folder, m = run(exp, progress=lambda s: None)
    assert m["flows"]["exactly_once"], m["flows"]
    rep = json.loads((folder / "pfc.json").read_text())
    assert rep["totals"]["frames_sent"] == 0          # credits, never a pause
    voq = rep["voq"]
    assert voq["scheduled"] and voq["grants"] >= voq["granted_queues"] == 4 * 3
    verdict = m["fidelity"]
    if rep["totals"]["drops"]:      # only where the emulator fell behind, and then said so
        assert verdict["verdict"] == "unfaithful" and any(
            "lossless drops" in r for r in verdict["reasons"]), verdict
    if verdict["verdict"] == "faithful":
        # the spines never hold more than a few frames: nothing arrives unscheduled
        assert spine_queue_p99_bytes(folder, m) <= 4 * 4150
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the credit frames are not decoded")
    out = subprocess.run(["tshark", "-r", str(folder / "pcaps" / f"{port}.pcap"),
                          *tshark_lua_args(), "-Y", "aft_voq.opcode == 2", "-T", "fields",
                          "-e", "aft_voq.dst", "-e", "aft_voq.credit"],
                         capture_output=True, text=True, timeout=60, check=True)
    frames = [line.split("\t") for line in out.stdout.splitlines() if line]
    others = {a for h, a in plan(exp.resolve_topology()).loopback.items()
              if h.startswith("l") and h != "l0h0"}
    assert frames and {d for d, _ in frames} <= others, frames[:5]
    # a grant is a share of the destination's 10 Mbit/s: at most 0.98 of it
    assert max(int(c) for _, c in frames) <= 0.98 * 10e6 / 8 + 1
    assert any(int(c) > 0 for _, c in frames)
