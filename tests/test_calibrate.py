"""Calibration and --rate: the model as pure functions, and refusal before anything is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import rate as calibrate
from testbed.experiment import Experiment
from topologies.files import build

from .test_cli import ROOT


def cal(cost_us: float = 10.0, per_hop_us: float = 2.0) -> dict:
    return {"machine": calibrate.machine_key(), "t": time.time(), "date_utc": "now",
            "model": calibrate.MODEL, "engine": calibrate.agents_engine(),
            "cost_us_per_packet": cost_us, "cost_us_per_hop": per_hop_us,
            "budget_pps_direct": round(1e6 / cost_us), "runs": {}}


def test_rescaling_keeps_rate_ratios_and_real_rates():
    topo = build("rail_optimized", {"servers": 2, "gpus_per_server": 2})
    fast = calibrate.rescaled(topo, 400.0)
    for (_, _, d), (_, _, e) in zip(topo.graph.edges(data=True), fast.graph.edges(data=True),
                                    strict=True):
        assert e["rate_mbps"] == pytest.approx(4 * d["rate_mbps"])
        assert e["rate_mbps"] * fast.scale_factor == pytest.approx(
            d["rate_mbps"] * topo.scale_factor)


def test_a_slower_rate_stretches_the_rto_a_faster_one_keeps_it():
    assert calibrate.scaled_rto_ms(50.0, 100.0, 5.0) == pytest.approx(1000.0)
    assert calibrate.scaled_rto_ms(50.0, 100.0, 100.0) == 50.0
    assert calibrate.scaled_rto_ms(50.0, 100.0, 400.0) == 50.0


def test_the_run_hands_the_agents_the_stretched_rto():
    from testbed.run import agent_options, pick_link_rate
    exp = Experiment(rate=25.0, rto_ms=40.0,
                     topology={"kind": "one_tier", "params": {"nodes": 4, "planes": 1}})
    topo = exp.resolve_topology()
    slow, choice, rto = pick_link_rate(exp, topo, topo.endpoints(), None, print, None)
    assert choice is None and rto == pytest.approx(160.0)     # 100 -> 25 Mbit/s: x4
    assert agent_options(exp, slow.scale_factor, rto)["rto_ms"] == pytest.approx(160.0)
    same = Experiment(topology={"kind": "one_tier", "params": {"nodes": 4, "planes": 1}})
    assert pick_link_rate(same, topo, topo.endpoints(), None, print, None)[2] == same.rto_ms


def test_offered_load_of_a_ring_and_an_incast():
    topo = build("one_tier", {"nodes": 8, "planes": 1})
    ranks = topo.endpoints()
    ring = calibrate.offered_load(Experiment(workload="allreduce"), topo, ranks, None)
    assert ring["offered_mbps"] == 800 and ring["mean_switch_hops"] == 1
    incast = calibrate.offered_load(Experiment(workload="incast"), topo, ranks, None)
    assert incast["offered_mbps"] == 100          # the receiver's one port


def test_a_ring_runs_at_its_slowest_hop():
    """On a rail-optimized fabric the ring's NVLink hops carry no more than its rail hops:
    every rank forwards a chunk once it has arrived."""
    topo = build("rail_optimized", {"servers": 2, "gpus_per_server": 4})
    ranks = topo.endpoints()
    ring = calibrate.offered_load(Experiment(workload="allreduce"), topo, ranks, None)
    assert ring["offered_mbps"] == len(ranks) * calibrate.base_rate_mbps(topo)
    a2a = calibrate.offered_load(Experiment(workload="alltoall"), topo, ranks, None)
    assert a2a["offered_mbps"] > ring["offered_mbps"]     # not a ring: NVLink at its rate


def test_offered_load_takes_the_fabrics_routes():
    """A host never forwards: h0's flow to h2 goes round by the switches (4 switch hops),
    not across h1 (3 nodes between them in the bare graph)."""
    import networkx as nx

    from topologies.spec import Topology
    g = nx.Graph()
    for n in ("h0", "h1", "h2"):
        g.add_node(n, role="cpu", server=None, rail=None, forwards=False)
    for n in ("s0", "s1", "s2", "s3"):
        g.add_node(n, role="leaf", server=None, rail=None, forwards=True)
    for a, b in (("h0", "s0"), ("s0", "h1"), ("h1", "s1"), ("s1", "h2"),
                 ("s0", "s2"), ("s2", "s3"), ("s3", "s1")):
        g.add_edge(a, b, rate_mbps=100.0)
    topo = Topology(name="detour", kind="custom", graph=g)
    load = calibrate.offered_load(Experiment(workload="incast"), topo, ["h0", "h2"], None)
    assert load["flows"] == 1 and load["mean_switch_hops"] == 4


def test_pick_rate_follows_the_budget():
    topo = build("one_tier", {"nodes": 16, "planes": 1})
    exp = Experiment(workload="allreduce")
    fast = calibrate.pick_rate(cal(5.0, 1.0), exp, topo, topo.endpoints(), None)
    slow = calibrate.pick_rate(cal(20.0, 4.0), exp, topo, topo.endpoints(), None)
    assert fast["rate_mbps"] > slow["rate_mbps"]
    assert fast["rate_mbps"] in calibrate.RATE_LADDER_MBPS
    # 16 senders x 100 Mbit/s of 4154-byte frames, 6 us each, at 60 % of the machine
    expected = 0.6 / (16 * 100e6 / calibrate.frame_bits(4096) * 6e-6) * 100
    assert fast["max_faithful_mbps"] == pytest.approx(expected, rel=1e-3)


def test_auto_keeps_a_frame_on_the_fastest_flow_long_enough():
    """On rail_optimized the NVLink hops (9x the rails) set the rate: a frame there lasts
    FRAME_COST_PACKETS packets' worth of the machine; a one-tier ring, whose links all
    run at one rate, stays bound by the CPU budget."""
    from testbed.rate import FRAME_COST_PACKETS
    topo = build("rail_optimized", {"servers": 4, "gpus_per_server": 4})
    ranks = topo.endpoints()
    exp = Experiment(workload="allreduce", ring_order="rails")
    got = calibrate.pick_rate(cal(7.6, 2.5), exp, topo, ranks, None)
    assert got["fastest_flow_mbps"] == 900.0 and got["bound_by"] == "port"
    frame_s = calibrate.frame_bits(4096) / (got["max_port_mbps"] / 100 * 900 * 1e6)
    assert frame_s == pytest.approx(FRAME_COST_PACKETS * got["cost_us_per_packet"] * 1e-6,
                                    rel=1e-2)
    assert got["rate_mbps"] == 25.0 < got["max_cpu_mbps"]
    assert got["max_faithful_mbps"] == got["max_port_mbps"]
    flat = build("one_tier", {"nodes": 16, "planes": 1})
    ring = calibrate.pick_rate(cal(7.6, 2.5), Experiment(workload="allreduce"), flat,
                               flat.endpoints(), None)
    assert ring["fastest_flow_mbps"] == 100.0 and ring["bound_by"] != "port"
    assert ring["max_port_mbps"] > ring["max_cpu_mbps"] > 100


def test_a_set_rate_is_refused_on_the_cpu_budget_not_the_port_bound():
    """Past the port bound the fast ports starve (the verdict says so); only a rate far
    past the CPU budget is refused before the build."""
    from testbed.run import rate_refusal
    topo = build("rail_optimized", {"servers": 4, "gpus_per_server": 4})
    exp = Experiment(workload="allreduce", ring_order="rails")
    ck = calibrate.rate_check(cal(7.6, 2.5), exp, topo, topo.endpoints(), None)
    assert not ck["within"] and ck["max_port_mbps"] * 3 < 100 < ck["max_cpu_mbps"]
    assert rate_refusal(ck, force=False) is None
    slow = calibrate.rate_check(cal(400.0, 10.0), exp, topo, topo.endpoints(), None)
    assert "--force" in rate_refusal(slow, force=False)
    assert rate_refusal(slow, force=True) is None


def test_auto_never_runs_faster_than_the_topology():
    topo = build("one_tier", {"nodes": 4, "planes": 1, "rate_mbps": 50})
    got = calibrate.pick_rate(cal(0.1, 0.0), Experiment(workload="incast"), topo,
                              topo.endpoints(), None)
    assert got["max_faithful_mbps"] > 1000 and got["rate_mbps"] == 50.0
    assert got["bound_by"] == "topology"


def test_auto_with_pfc_keeps_the_machines_rate():
    """PFC lowers an auto rate only by its controller's CPU: the run sizes the buffers for
    the rate instead (testbed.lossless_plan), so on a fast machine a 4 x 4 leaf-spine
    incast gets the rate it gets without PFC."""
    topo = build("leaf_spine", {"leaves": 4, "spines": 4, "hosts_per_leaf": 4})
    fast = cal(0.1, 0.0)
    plain = calibrate.pick_rate(fast, Experiment(workload="incast"), topo,
                                topo.endpoints(), None)
    got = calibrate.pick_rate(fast, Experiment(workload="incast", pfc="on"), topo,
                              topo.endpoints(), None)
    assert got["rate_mbps"] == plain["rate_mbps"] == 100.0


def test_the_switch_controller_comes_off_the_cpu_budget():
    """The controller polls every switch port each pfc_poll_ms whatever the rate: its
    share (POLL_COST_PACKETS packets' worth a port, one core at most) leaves the packets
    less of the machine. Without a switch mode there is none."""
    from testbed.rate import (
        POLL_COST_PACKETS,
        PORT_POLL_COST_PACKETS,
        controller_cores,
        cores_of,
    )
    topo = build("leaf_spine", {"leaves": 2, "spines": 2, "hosts_per_leaf": 2})
    ports = 2 * (2 + 2) + 2 * 2
    c, exp = cal(10.0, 2.0), Experiment(workload="permutation", pfc="on")
    assert controller_cores(c, exp, topo) == pytest.approx(
        (POLL_COST_PACKETS + ports * PORT_POLL_COST_PACKETS) * 10e-6 / 0.5e-3)
    assert controller_cores(c, Experiment(workload="permutation"), topo) == 0.0
    assert controller_cores(c, Experiment(workload="permutation", ecn="on"), topo) > 0
    slower_polls = Experiment(workload="permutation", pfc="on", pfc_poll_ms=2.0)
    assert controller_cores(c, slower_polls, topo) == pytest.approx(
        controller_cores(c, exp, topo) / 4)
    big = build("leaf_spine", {"leaves": 8, "spines": 8, "hosts_per_leaf": 8})
    assert controller_cores(cal(50.0, 2.0), exp, big) == 1.0      # one thread: one core
    plain = calibrate.predict(c, Experiment(workload="permutation"), topo,
                              topo.endpoints(), None)
    pfc = calibrate.predict(c, exp, topo, topo.endpoints(), None)
    share = pfc["controller_cores"] / cores_of(c)
    assert plain["controller_cores"] == 0.0 < share
    assert pfc["max_cpu_mbps"] == pytest.approx(
        plain["max_cpu_mbps"] * (calibrate.UTILIZATION - share) / calibrate.UTILIZATION,
        rel=1e-2)


def test_a_controller_that_takes_the_whole_budget_stops_auto_not_a_set_rate():
    """Where the controller leaves the packets nothing, auto finds no rate and says why;
    a rate set by hand is refused only on the packets' own budget (the verdict reports
    a machine running hot)."""
    from testbed.run import rate_refusal
    from topologies.spec import SpecError
    topo = build("leaf_spine", {"leaves": 4, "spines": 4, "hosts_per_leaf": 4})
    c = cal(50.0, 2.0) | {"machine": calibrate.machine_key() | {"cores": 1}}
    exp = Experiment(workload="permutation", pfc="on")
    ck = calibrate.rate_check(c, exp, topo, topo.endpoints(), None)
    assert ck["controller_cores"] == 1.0 and ck["max_cpu_mbps"] == 0.0
    assert ck["max_packets_mbps"] > 0 and not ck["within"]
    assert rate_refusal(ck | {"rate_mbps": ck["max_packets_mbps"]}, force=False) is None
    assert "--force" in rate_refusal(ck | {"rate_mbps": 5 * ck["max_packets_mbps"]},
                                     force=False)
    with pytest.raises(SpecError, match="switch controller alone takes 1 of the 1 cores"):
        calibrate.pick_rate(c, exp, topo, topo.endpoints(), None)


def test_a_rate_set_by_hand_is_checked_against_the_calibration():
    topo = build("one_tier", {"nodes": 16, "planes": 1})          # 100 Mbit/s links
    exp = Experiment(workload="allreduce")
    assert calibrate.rate_check(None, exp, topo, topo.endpoints(), None) is None
    fast = calibrate.rate_check(cal(1.0, 0.0), exp, topo, topo.endpoints(), None)
    slow = calibrate.rate_check(cal(20.0, 4.0), exp, topo, topo.endpoints(), None)
    assert fast["rate_mbps"] == slow["rate_mbps"] == 100.0
    assert fast["within"] and fast["max_faithful_mbps"] > 100 > slow["max_faithful_mbps"]
    assert not slow["within"]
    assert slow["max_faithful_mbps"] == calibrate.predict(
        cal(20.0, 4.0), exp, topo, topo.endpoints(), None)["max_faithful_mbps"]


@pytest.mark.root
def test_a_run_at_a_rate_beyond_the_calibration_says_so_before_and_after(
        tmp_path, monkeypatch, host_untouched):
    from testbed.experiment import from_toml
    from testbed.run import run
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal(cost_us=2000.0)))      # a very slow machine
    monkeypatch.setattr(calibrate, "CACHE", path)
    exp = from_toml(None, {"name": "t_rate_check", "workload": "p2p",
                           "message_bytes": 65536, "iterations": 1,
                           "results_dir": str(tmp_path / "res"),
                           "topology": {"kind": "one_tier", "params": {"nodes": 2}}})
    said: list[str] = []
    folder, m = run(exp, progress=said.append)
    ck = m["rate_check"]
    assert m["rate_choice"] is None and ck["rate_mbps"] == 100.0 and not ck["within"]
    assert ck["max_faithful_mbps"] < 100.0
    before = [s for s in said if "likely to fall behind" in s]
    assert before and said.index(before[0]) < next(
        k for k, s in enumerate(said) if s.startswith("results:"))    # before building
    assert "set, not auto" in (folder / "summary.md").read_text()


def test_auto_refuses_before_building_when_even_the_lowest_rate_is_too_much(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal(cost_us=5000.0)))
    env = {**os.environ, "AFT_CALIBRATION": str(path)}
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "--topology", "one_tier",
                          "--rate", "auto", "--results", str(tmp_path / "res")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    if os.geteuid() != 0:
        pytest.skip("run needs root to get past its checks")
    assert out.returncode == 2, out.stderr
    assert "experiment.rate: auto" in out.stderr and "lowest sensible" in out.stderr
    assert not (tmp_path / "res").exists()


def test_a_stale_or_foreign_calibration_is_not_used(tmp_path):
    path = tmp_path / "cal.json"
    old = cal()
    old["t"] -= 30 * 86400
    path.write_text(json.dumps(old))
    assert calibrate.load_cached(path) is None
    other = cal()
    other["machine"] = {**other["machine"], "cpu_model": "another"}
    path.write_text(json.dumps(other))
    assert calibrate.load_cached(path) is None
    flat_out = {k: v for k, v in cal().items() if k != "model"}   # measured unpaced: stale
    path.write_text(json.dumps(flat_out))
    assert calibrate.load_cached(path) is None
    other_engine = {**cal(), "engine": "interpreted" if calibrate.agents_engine() ==
                    "compiled" else "compiled"}
    path.write_text(json.dumps(other_engine))
    assert calibrate.load_cached(path) is None          # measured by the other engine
    from traffic.engine import engine_name
    assert engine_name("interpreted (compiled path not built: x)") == "interpreted"
    path.write_text(json.dumps({k: v for k, v in cal().items() if k != "engine"}))
    assert calibrate.load_cached(path) is None          # engine not recorded
    path.write_text(json.dumps(cal()))
    assert calibrate.load_cached(path)["cost_us_per_packet"] == 10.0


@pytest.mark.parametrize("damage", [
    "[1, 2]", '"text"', "null", "{}", "\xff\xfe", "{not json",
    {"t": "yesterday"}, {"t": None}, {"t": time.time() + 1000 * 365 * 86400},
    {"cost_us_per_packet": "10"}, {"cost_us_per_packet": 0}, {"cost_us_per_hop": -1},
    {"budget_pps_direct": float("nan")}, {"cost_us_per_packet": True}, {"runs": [1]}])
def test_a_damaged_calibration_is_none_never_an_error(tmp_path, damage):
    path = tmp_path / "cal.json"
    if isinstance(damage, dict):
        path.write_text(json.dumps({**cal(), **damage}))
    else:
        path.write_bytes(damage.encode("latin-1"))
    assert calibrate.load_cached(path) is None
    for odd in (tmp_path, Path("/dev/null"), Path("/proc")):      # not a file of JSON
        assert calibrate.load_cached(odd) is None


def test_auto_with_nothing_cached_measures_a_calibration_first(tmp_path, monkeypatch):
    """Every caller of rate auto (a run, a script, a benchmark) goes through
    ensure_calibration: nothing cached, it measures one with the run pipeline and says so;
    cached, it measures nothing."""
    from testbed import calibrate as cal_module
    from testbed import run as run_module
    measured = []

    def fake_calibrate(run, progress=None, path=None, repeats=3):
        measured.append(run)
        return cal()
    monkeypatch.setattr(cal_module, "calibrate", fake_calibrate)
    monkeypatch.setattr(cal_module, "CACHE", tmp_path / "none.json")
    monkeypatch.setattr(calibrate, "CACHE", tmp_path / "none.json")
    said: list[str] = []
    assert run_module.ensure_calibration(said.append)["cost_us_per_packet"] == 10.0
    assert measured == [run_module.run] and "measuring one first" in said[0]
    (tmp_path / "none.json").write_text(json.dumps(cal()))
    said.clear()
    assert run_module.ensure_calibration(said.append)["cost_us_per_packet"] == 10.0
    assert len(measured) == 1 and said == []
    assert run_module.script_rate(40.0, lambda rate: [], said.append) == 40.0


@pytest.fixture
def nothing_cached(tmp_path, monkeypatch):
    """No calibration cached; measuring one gives a very slow machine's, and is counted."""
    from testbed import calibrate as cal_module
    measured = []

    def fake_calibrate(run, progress=None, path=None, repeats=3):
        measured.append(run)
        return cal(cost_us=2000.0)
    monkeypatch.setattr(cal_module, "calibrate", fake_calibrate)
    monkeypatch.setattr(cal_module, "CACHE", tmp_path / "none.json")
    monkeypatch.setattr(calibrate, "CACHE", tmp_path / "none.json")
    return measured


def _experiment(tmp_path, rate) -> Experiment:
    from testbed.experiment import from_toml
    return from_toml(None, {"workload": "alltoall", "rate": rate, "topology": "leaf_spine",
                            "results_dir": str(tmp_path / "res")})


def test_a_set_rate_with_no_calibration_measures_one_and_is_judged(tmp_path, nothing_cached):
    """The CLI (force False) with --rate 100 and nothing cached: the calibration is
    measured first, said in a line, and the rate refused by it before anything is built."""
    from testbed.run import run
    from topologies.spec import SpecError
    said: list[str] = []
    with pytest.raises(SpecError, match="what this machine carries faithfully") as err:
        run(_experiment(tmp_path, 100.0), progress=said.append, force=False)
    assert err.value.field == "experiment.rate"
    assert len(nothing_cached) == 1 and "measuring one first" in said[0]
    assert not (tmp_path / "res").exists()


def test_the_topologys_own_rate_with_no_calibration_is_said_not_judged(tmp_path,
                                                                       nothing_cached):
    """No --rate and nothing cached: one line says the rate is not judged before the run,
    nothing is measured; --force measures nothing and says nothing. (A results folder
    that cannot be made stops each run after the rate is settled, before building.)"""
    from testbed.run import run
    from topologies.spec import SpecError
    (tmp_path / "res").write_text("a file on the way")
    for rate, force, lines in (("", False, 1), (100.0, True, 0), ("", True, 0)):
        said: list[str] = []
        with pytest.raises(SpecError) as err:
            run(_experiment(tmp_path, rate), progress=said.append, force=force)
        assert err.value.field == "experiment.results_dir", err.value
        assert len([s for s in said if "not judged before the run" in s]) == lines, said
    assert nothing_cached == []


def test_a_scripts_auto_rate_is_one_rate_that_fits_its_most_demanding_run(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal(5.0, 1.0)))

    def experiments(rate):
        return [Experiment(workload=w, topology={"kind": "one_tier", "params": {
            "nodes": n, "planes": 1, "rate_mbps": rate}}) for w, n in (("allreduce", 16),
                                                                       ("incast", 4))]
    path.write_text(json.dumps(cal(20.0, 4.0)))     # slow enough for both to be below
    said = []                                       # the topology's 100 Mbit/s
    got = calibrate.common_rate("auto", experiments, said.append, cache=path)
    alone = [calibrate.pick_rate(calibrate.load_cached(path), e, e.resolve_topology(),
                                 e.resolve_topology().endpoints(), None)["rate_mbps"]
             for e in experiments(100.0)]
    assert got == min(alone) < max(alone)           # the 16-rank ring sets it
    assert "for every run" in said[0] and f"{got:g} Mbit/s" in said[0]
    assert calibrate.common_rate(40.0, experiments, said.append, cache=path) == 40.0
    from topologies.spec import SpecError
    with pytest.raises(SpecError, match="testbed calibrate"):
        calibrate.common_rate("auto", experiments, said.append, cache=tmp_path / "none")


@pytest.mark.root
def test_calibration_measures_paced_runs_and_caches_them(tmp_path, host_untouched):
    from testbed.calibrate import CALIBRATION_BYTES, RUNS, describe
    from testbed.calibrate import calibrate as measure
    from testbed.run import run
    path = tmp_path / "cal.json"
    data = measure(run, path=path, repeats=2)
    assert calibrate.load_cached(path) == data and data["model"] == calibrate.MODEL
    assert data["engine"] == calibrate.agents_engine()      # what its agents ran
    for name, (hops, _, flows) in RUNS.items():
        run = data["runs"][name]
        assert run["switch_hops"] == hops
        # each measured twice; the kept run is the lower middle one, a run of its own
        runs = run["machine_us_per_packet_runs"]
        assert len(runs) == 2 and run["machine_us_per_packet"] == min(runs)
        assert "the median of 2 runs" in describe(data)
        assert run["packets"] == len(flows) * CALIBRATION_BYTES // 4096    # all delivered
        assert run["machine_us_per_packet"] > 0 and run["fidelity"]
        assert name in describe(data)
    one = data["runs"]["one_hop"]["machine_us_per_packet"]
    a, b = data["cost_us_per_packet"], data["cost_us_per_hop"]
    assert b >= 0 and 0 < a <= one
    # a + b is the one-hop run's cost, unless a would be below half of it (then a half)
    assert a + b == pytest.approx(one, abs=0.01) or a == pytest.approx(one / 2, abs=0.01)
    assert data["budget_pps_direct"] == pytest.approx(1e6 / a, rel=1e-3)
