"""Virtual output queues: the settings, the queues a port keeps, the counters' queue choice,
the netlink fallback's charging, and, as root, the layout, the per-destination hold (eBPF
counters and netlink both) and claim 2's incast beside a victim with its pauses decoded.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fabric.addressing import plan
from fabric.lossless import (
    HOLD_RATE_BYTES_PER_S,
    SwitchSettings,
    install,
    voq_handle,
)
from fabric.qdisc_poller import QdiscPoller
from fabric.queue_counters import MAX_DSTS, hook_config
from fabric.routing import compute_routes
from fabric.shaping import handle_int
from fabric.switch_ports import ControllerTuning
from fabric.voq import MAX_VOQS_PER_PORT, check_size, port_destinations
from fabric.voq_control import VoqController, VoqPair, charge, voq_controller_running
from fabric.wire import tshark_lua_args
from testbed.experiment import from_toml
from testbed.features import Switches
from topologies import leaf_spine
from topologies.spec import SpecError

from .conftest import assert_lossless_unless_late

INCAST = ["l0h0>l1h0", "l0h1>l1h0", "l0h2>l1h0"]
VICTIM = "l0h3>l1h1"


def claim2_topo(**kw):
    return leaf_spine(leaves=2, spines=1, hosts_per_leaf=4, uplink_rate_mbps=400.0,
                      queue_bytes=2 << 20, **kw)


# -- settings --------------------------------------------------------------------------
def test_voq_brings_pfc_on_and_refuses_what_reads_one_fifo():
    assert SwitchSettings(voq="on").pfc == "on"
    assert SwitchSettings(voq="on", pfc="on").enabled
    with pytest.raises(SpecError, match=r"experiment\.voq.*pfc 'on'"):
        SwitchSettings(voq="on", pfc="off")
    for key, value in (("ecn", "on"), ("switch_lb", "dlb"), ("trimming", "on")):
        with pytest.raises(SpecError, match=rf"experiment\.voq.*{key}"):
            SwitchSettings(voq="on", **{key: value})
    with pytest.raises(SpecError, match=r"experiment\.voq"):
        from_toml(None, {"name": "x", "voq": "yes"})


def test_voq_is_refused_across_servers():
    exp = from_toml(None, {"name": "x", "voq": "on"})
    key, why = Switches().spread_refusal(exp)
    assert key == "voq" and "destination" in why
    assert Switches().spread_refusal(from_toml(None, {"name": "x", "pfc": "on"})) is None


# -- the queues a port keeps -----------------------------------------------------------
def test_port_destinations_are_what_the_peer_forwards_on():
    topo = claim2_topo()
    addr = plan(topo)
    dests = port_destinations(topo, compute_routes(topo), addr.ports)
    hosts1 = ("l1h0", "l1h1", "l1h2", "l1h3")
    assert dests[("l0h0", addr.port("l0h0", "leaf0").ifname)] == (
        "l0h1", "l0h2", "l0h3", *hosts1)
    assert dests[("leaf0", addr.port("leaf0", "spine0").ifname)] == hosts1
    assert dests[("spine0", addr.port("spine0", "leaf1").ifname)] == hosts1
    # a port toward a host that does not forward keeps its single lossless queue
    assert ("leaf1", addr.port("leaf1", "l1h0").ifname) not in dests


def test_a_fabric_too_large_for_the_queues_is_refused():
    check_size(claim2_topo())
    big = leaf_spine(leaves=2, spines=1, hosts_per_leaf=MAX_VOQS_PER_PORT // 2 + 1)
    with pytest.raises(SpecError, match=rf"experiment\.voq.*at most {MAX_VOQS_PER_PORT}"):
        check_size(big)


def test_counter_program_gets_destinations_as_on_the_wire():
    cfg = hook_config(4, 26, dsts=("198.19.0.5", "198.19.1.2"))
    assert cfg.dst_count == 2
    as_bytes = bytes(cfg.dst_addr)[:8]
    assert as_bytes == ipaddress.IPv4Address("198.19.0.5").packed + \
        ipaddress.IPv4Address("198.19.1.2").packed
    assert hook_config(4, 26).dst_count == 0
    with pytest.raises(ValueError, match="destination queues"):
        hook_config(4, 26, dsts=tuple(f"198.19.0.{k}" for k in range(MAX_DSTS + 1)))


# -- the netlink fallback's charging -------------------------------------------------------
def pair(weight: float = 0.0, last_sent: int | None = None) -> VoqPair:
    return VoqPair(None, "d", "198.19.0.1", 0, (b"", b""), (b"", b""), [], [],
                   weight=weight, last_sent=last_sent)


def test_charge_by_shares_then_by_all_sent_then_equally():
    alone = [pair()]
    charge(alone, 900)
    assert alone[0].occupancy == 900
    shared = [pair(weight=1000), pair(weight=3000), pair(weight=0, last_sent=50)]
    charge(shared, 800)
    assert [p.occupancy for p in shared] == [200, 600, 0]
    unknown = [pair(last_sent=100), pair(last_sent=300), pair()]
    charge(unknown, 400)
    assert [p.occupancy for p in unknown] == [100, 300, 0]
    fresh = [pair(), pair()]
    charge(fresh, 400)
    assert [p.occupancy for p in fresh] == [200, 200]


# -- as root ---------------------------------------------------------------------------
def tbf_rates(fab, node: str, ifname: str) -> dict[int, int]:
    """handle -> the rate (bytes/s) of every tbf on a port."""
    with fab.ipr(node) as ipr:
        (index,) = ipr.link_lookup(ifname=ifname)
        return {q["handle"]: q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"]
                for q in ipr.get_qdiscs(index=index) if q.get_attr("TCA_KIND") == "tbf"}


@pytest.mark.root
def test_layout_sends_each_destination_into_its_own_queue(fabric, tmp_path: Path):
    from traffic.workloads import build_schedule

    from .test_pfc import run
    fab = fabric(leaf_spine(leaves=2, spines=1, hosts_per_leaf=2))
    install(fab, SwitchSettings(voq="on").traffic_class, voq=True)
    uplink = fab.plan.port("leaf0", "spine0").ifname
    dests = port_destinations(fab.topo, fab.routes, fab.plan.ports)[("leaf0", uplink)]
    assert dests == ("l1h0", "l1h1")
    res = run(fab, [(build_schedule("p2p", ["l0h0", "l1h0"], 400_000), {"timeout_s": 20}),
                    (build_schedule("p2p", ["l0h1", "l1h1"], 200_000), {"timeout_s": 20})],
              tmp_path)
    assert all(r["ok"] for r in res.values()), {n: r["error"] for n, r in res.items()}
    handles = tuple(handle_int(voq_handle(k)) for k in range(len(dests)))
    with fab.ipr("leaf0") as ipr:
        (index,) = ipr.link_lookup(ifname=uplink)
    from fabric import netns
    with netns.entered(fab.ns("leaf0")), QdiscPoller(handle_int("13:"), handles) as poller:
        poller.poll()
        sent = {h: poller.detail[(index, h)][2] for h in (handle_int("13:"), *handles)}
    # 400 kB to l1h0 and 200 kB to l1h1, each in its own queue; none in the other one
    assert 400_000 <= sent[handles[0]] < 440_000, sent
    assert 200_000 <= sent[handles[1]] < 220_000, sent
    assert sent[handle_int("13:")] == 0, sent


@pytest.mark.root
@pytest.mark.parametrize("kernel_counters", [True, False], ids=["ebpf", "netlink"])
def test_a_pause_holds_only_the_queues_of_that_ingress(fabric, kernel_counters: bool):
    fab = fabric(leaf_spine(leaves=2, spines=1, hosts_per_leaf=2))
    into_leaf1 = fab.plan.port("leaf1", "spine0").ifname
    spine_out = fab.plan.port("spine0", "leaf1").ifname
    spine_in = fab.plan.port("spine0", "leaf0").ifname      # toward leaf0: never held
    tuning = ControllerTuning(kernel_counters=kernel_counters)
    with voq_controller_running(fab, SwitchSettings(voq="on"), tuning) as ctl:
        held_rate = HOLD_RATE_BYTES_PER_S
        open_rates = tbf_rates(fab, "spine0", spine_out)
        assert len(open_rates) == 3 and held_rate not in open_rates.values()
        ctl.pause("leaf1", into_leaf1)
        from .conftest import wait_for
        voqs = {handle_int(voq_handle(k)) for k in range(2)}
        assert wait_for(lambda: all(tbf_rates(fab, "spine0", spine_out)[h] == held_rate
                                    for h in voqs), 5.0)
        assert held_rate not in tbf_rates(fab, "spine0", spine_in).values()
        assert tbf_rates(fab, "spine0", spine_out)[handle_int("13:")] != held_rate
        ctl.pause("leaf1", into_leaf1, on=False)
        assert wait_for(lambda: tbf_rates(fab, "spine0", spine_out) == open_rates, 5.0)
    rep = ctl.report()
    source = rep["calibration"]["occupancy_from"]
    assert source.startswith("kernel" if kernel_counters else "netlink"), source
    # one pause and one release frame per destination held, from leaf1's port
    port = rep["ports"][f"leaf1:{into_leaf1}"]
    assert port["xoff_frames"] == 2 and port["xon_frames"] == 2 and not rep["errors"]
    assert {(r["dest"], r["holds"]) for r in rep["voq"]["pairs"] if r["holds"]} == {
        ("l1h0", 1), ("l1h1", 1)}


def flows(folder: Path) -> dict[str, dict]:
    import csv
    with open(folder / "flows.csv") as fh:
        return {r["tag"].split(".", 1)[1]: r for r in csv.DictReader(fh) if r["role"] == "recv"}


@pytest.mark.root
def test_victim_keeps_its_rate_beside_an_incast_held_per_destination(host_untouched,
                                                                      tmp_path: Path):
    from testbed.run import run
    spine_side = "leaf1-eth4"        # leaf1's port toward spine0: its pauses leave here
    exp = from_toml(None, {
        "name": "voq", "workload": "p2p", "pairs": [*INCAST, VICTIM],
        "message_bytes": 1_000_000, "iterations": 1, "transport": "roce",
        "entropy": "ecmp", "voq": "on", "window_packets": 512, "pfc_xoff_bytes": 150_000,
        "pfc_xon_bytes": 75_000, "results_dir": str(tmp_path), "timeout_s": 120.0,
        "rto_ms": 200.0, "pcap": [spine_side],
        "topology": {"name": "leaf_spine", "kind": "leaf_spine", "params": {
            "leaves": 2, "spines": 1, "hosts_per_leaf": 4, "uplink_rate_mbps": 400.0,
            "queue_bytes": 2 << 20}}})
    folder, m = run(exp, progress=lambda s: None)
    rep = json.loads((folder / "pfc.json").read_text())
    got = flows(folder)
    assert all(f["exactly_once"] == "True" for f in got.values()), got
    assert_lossless_unless_late(rep)
    voq = rep["voq"]
    assert "l1h0" in voq["held_destinations"], voq
    # the incast's queues toward l1h0 took the pauses; the victim's, toward l1h1, went on
    victim = float(got[VICTIM]["goodput_mbps"])
    incast = [float(got[p]["goodput_mbps"]) for p in INCAST]
    assert victim > 1.5 * max(incast), (victim, incast)
    held_s = {d: sum(r["held_s"] for r in voq["pairs"] if r["dest"] == d)
              for d in voq["held_destinations"]}
    assert held_s.get("l1h1", 0.0) < 0.1 * held_s["l1h0"], held_s
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the pause frames are not decoded")
    out = subprocess.run(["tshark", "-r", str(folder / "pcaps" / f"{spine_side}.pcap"),
                          *tshark_lua_args(), "-Y", "aft_voq.opcode == 1", "-T", "fields",
                          "-e", "aft_voq.dst", "-e", "aft_voq.quanta"],
                         capture_output=True, text=True, timeout=60, check=True)
    frames = [line.split("\t") for line in out.stdout.splitlines() if line]
    l1h0 = exp.resolve_topology() and plan(exp.resolve_topology()).loopback["l1h0"]
    assert any(d == l1h0 and int(q) > 0 for d, q in frames), frames[:5]
    assert any(d == l1h0 and int(q) == 0 for d, q in frames), frames[:5]
    assert {d for d, _ in frames} <= {plan(exp.resolve_topology()).loopback[h]
                                      for h in voq["held_destinations"]}


def test_voq_controller_is_a_switch_controller():
    # the run's feature hooks, report and teardown are the PFC controller's
    from fabric.switch_control import SwitchController
    assert issubclass(VoqController, SwitchController)
    assert "voq_rows" in VoqController.STATE
