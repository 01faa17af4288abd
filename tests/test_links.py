"""Tests for topologies.physics (no root): profiles and their TOML overrides, reach, BER to
packet loss, lane failures to rate, failure schedules, energy by hand, cost tables (also of
rail-optimized vs rail-only at a real cluster's size)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from topologies import full_mesh, leaf_spine, rail_optimized
from topologies.at_scale import (
    AT_SCALE_GPUS,
    GPU_LINK_GBPS,
    SWITCH_GBPS,
    cut_percent,
    radix,
    rail_fabrics,
    rail_only_cut,
)
from topologies.physics import (
    FailureEvent,
    LaneState,
    ber_for_loss,
    check_topology,
    cost_table,
    energy_report,
    expected_failures,
    format_cost_table,
    lanes_for_rate,
    link_energy,
    load_profiles,
    packet_loss,
    parse_events,
    ports_for_rate,
    random_failures,
)
from topologies.spec import SpecError, Topology

ROOT = Path(__file__).resolve().parent.parent


# -- profiles -------------------------------------------------------------------------------
def test_default_profiles_carry_the_documented_numbers():
    p = load_profiles()
    assert {"copper", "laser", "microled", "nvlink"} <= set(p.profiles)
    laser, led, cu = p.for_tech("laser"), p.for_tech("microled"), p.for_tech("copper")
    assert (laser.ref_lanes, laser.lane_rate_gbps, laser.ref_rate_gbps) == (8, 100.0, 800.0)
    assert (led.ref_lanes, led.lane_rate_gbps, led.ref_rate_gbps) == (400, 2.0, 800.0)
    assert (cu.reach_m, led.reach_m, laser.reach_m) == (2.0, 50.0, 500.0)
    assert led.power_w_per_end == pytest.approx(laser.power_w_per_end * (1 - 0.68))
    assert laser.lane_failure == cu.lane_failure == "link_down" and led.lane_failure == "degrade"
    # laser fails 100x as often as copper and as microLED (whole links)
    assert laser.ref_lanes * laser.lane_fit == pytest.approx(100 * cu.link_fit)
    assert laser.ref_lanes * laser.lane_fit == pytest.approx(100 * led.link_fit)
    assert laser.pj_per_bit == pytest.approx(30.0)      # 2 x 12 W / 800 Gb/s


def test_nvlink_is_3_6_tbps_per_direction():
    """NVLink 4's 900 GB/s per H100 is both directions together: 450 GB/s = 3.6 Tb/s
    each way, 18 links of 200 Gb/s; the default emulated rate is 3.6 Tb/s / 4000."""
    from topologies.spec import DEFAULT_NVLINK_RATE_MBPS
    nv = load_profiles().for_tech("nvlink")
    assert (nv.lane_rate_gbps, nv.ref_rate_gbps, nv.ref_lanes) == (200.0, 3600.0, 18)
    assert DEFAULT_NVLINK_RATE_MBPS * 4000 == 3.6e6            # Mbit/s real = 3.6 Tb/s
    topo = rail_optimized(servers=1, gpus_per_server=2, spines=1)
    assert topo.graph.edges["s0g0", "nvs0"]["rate_mbps"] == DEFAULT_NVLINK_RATE_MBPS
    assert load_profiles().link_lanes(topo, "s0g0", "nvs0") == 18


@pytest.mark.parametrize(("tech", "real_gbps", "lanes"), [
    ("microled", 400.0, 200), ("microled", 800.0, 400), ("microled", 401.0, 201),
    ("laser", 400.0, 4), ("laser", 800.0, 8), ("laser", 150.0, 2),
    ("copper", 400.0, 4), ("copper", 800.0, 8), ("nvlink", 3600.0, 18)])
def test_lanes_follow_the_real_rate(tech, real_gbps, lanes):
    assert lanes_for_rate(load_profiles().for_tech(tech), real_gbps) == lanes


def test_link_lanes_use_rate_times_scale_factor():
    # 100 Mbit/s x 4000 = 400 Gb/s host links, 200 Mbit/s = 800 Gb/s leaf-spine links
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="microled")
    p = load_profiles(overrides={"profiles": {"microled": {"spare_lanes": 4}}})
    assert p.link_lanes(topo, "s0g0", "leaf0") == 200
    assert p.link_lanes(topo, "leaf0", "spine0") == 400
    table = cost_table(topo, p)
    assert table["links"]["microled"]["lanes"] == 4 * (200 + 4) + 2 * (400 + 4)
    with pytest.raises(ValueError):
        lanes_for_rate(p.for_tech("laser"), 0.0)


def test_user_toml_overrides_and_adds_a_profile(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text("""
[profiles.microled]
spare_lanes = 16

[profiles.laser_4x200]
tech = "laser"
description = "800G as 4 x 200G lanes"
ref_rate_gbps = 800.0
spare_lanes = 0
lane_rate_gbps = 200.0
reach_m = 500.0
ber = 1e-12
power_w_per_end = 10.0
lane_fit = 100.0
link_fit = 0.0
lane_failure = "link_down"
repair_h = 4.0
cost_usd_per_link = 1000.0

[use]
laser = "laser_4x200"

[switches.leaf]
power_w = 500.0
""")
    p = load_profiles(f)
    assert p.for_tech("microled").spare_lanes == 16
    assert p.for_tech("microled").ref_lanes == 400      # the rest kept
    assert p.for_tech("laser").name == "laser_4x200" and p.for_tech("laser").ref_lanes == 4
    assert p.switches["leaf"].power_w == 500.0 and p.switches["leaf"].cost_usd == 25000.0
    assert "mine.toml" in p.source


@pytest.mark.parametrize(("data", "field"), [
    ({"profiles": {"microled": {"ref_rate_gbps": 0}}}, "profiles.microled.ref_rate_gbps"),
    ({"profiles": {"microled": {"lanes": 400}}}, "profiles.microled.lanes"),  # now derived
    ({"profiles": {"microled": {"ber": 0.7}}}, "profiles.microled.ber"),
    ({"profiles": {"microled": {"reach_m": -1}}}, "profiles.microled.reach_m"),
    ({"profiles": {"microled": {"power_w_per_end": "low"}}}, "profiles.microled.power_w_per_end"),
    ({"profiles": {"microled": {"lane_failure": "explode"}}}, "profiles.microled.lane_failure"),
    ({"profiles": {"microled": {"colour": "blue"}}}, "profiles.microled.colour"),
    ({"profiles": {"new_one": {"tech": "laser"}}}, "profiles.new_one.description"),
    ({"profiles": {"x": {"tech": "pigeon"}}}, "profiles.x.description"),
    ({"use": {"laser": "nope"}}, "use.laser"),
    ({"use": {"laser": "microled"}}, "use.laser"),
    ({"colours": {}}, "colours"),
])
def test_bad_profile_input_names_the_field(data, field):
    with pytest.raises(SpecError) as err:
        load_profiles(overrides=data)
    assert err.value.field == field


def test_unreadable_profile_file(tmp_path):
    with pytest.raises(SpecError, match="^link_profiles: no such file"):
        load_profiles(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("profiles = [")
    with pytest.raises(SpecError, match="^link_profiles: .* does not parse"):
        load_profiles(tmp_path / "bad.toml")
    with pytest.raises(SpecError, match="^link_profiles: .* not a regular file"):
        load_profiles("/dev/zero")
    (tmp_path / "flat.toml").write_text("profiles = 3\n")
    with pytest.raises(SpecError, match="^profiles: must be a table"):
        load_profiles(tmp_path / "flat.toml")


# -- reach ----------------------------------------------------------------------------------
def one_link(tech: str, length_m: float) -> Topology:
    g = nx.Graph()
    g.add_node("cpu0", role="cpu", server=None, rail=None, forwards=False)
    g.add_node("cpu1", role="cpu", server=None, rail=None, forwards=False)
    g.add_edge("cpu0", "cpu1", rate_mbps=100.0, queue_bytes=128 * 1024, length_m=length_m,
               tech=tech)
    return Topology("pair", "custom", g)


def test_reach_copper_3m_refused_microled_30m_fine():
    with pytest.raises(SpecError) as err:
        one_link("copper", 3.0).validate()
    assert err.value.field == "links.cpu0:cpu1.length_m" and "2 m reach of copper" in str(err.value)
    one_link("copper", 2.0).validate()
    one_link("microled", 30.0).validate()
    with pytest.raises(SpecError, match="50 m reach of microled"):
        one_link("microled", 51.0).validate()
    full_mesh(4)                                          # copper at 2 m: fine
    rail_optimized(tech="microled")                       # 10 m / 30 m microLED: fine


def test_leaf_spine_copper_uplinks_refused_naming_the_link():
    with pytest.raises(SpecError) as err:
        leaf_spine(tech="copper")
    assert err.value.field == "links.leaf0:spine0.length_m"


def test_reach_with_a_users_profile():
    topo = one_link("microled", 30.0).validate()
    check_topology(topo, load_profiles())
    short = load_profiles(overrides={"profiles": {"microled": {"reach_m": 20.0}}})
    with pytest.raises(SpecError, match="20 m reach of microled"):
        check_topology(topo, short)


def test_cli_refuses_reach_violation_with_exit_2():
    out = subprocess.run([sys.executable, "-m", "testbed", "validate", "leaf_spine", "--set",
                          "tech=copper"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "links.leaf0:spine0.length_m: 30 m is beyond the 2 m reach of copper" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- BER, loss, lanes -------------------------------------------------------------------
def test_ber_to_packet_loss():
    assert packet_loss(1e-13, 4174) == pytest.approx(8 * 4174 * 1e-13, rel=1e-6)
    assert packet_loss(0.0) == 0.0
    assert packet_loss(1e-4, 1000) == pytest.approx(1 - (1 - 1e-4) ** 8000)
    ber = ber_for_loss(0.01, 1000)
    assert packet_loss(ber, 1000) == pytest.approx(0.01)
    assert ber == pytest.approx(1.2563e-6, rel=1e-3)
    # smaller frames lose less at the same BER
    assert packet_loss(ber, 64) < packet_loss(ber, 1000)


def test_lane_failures_to_rate():
    p = load_profiles(overrides={"profiles": {"microled": {"spare_lanes": 4}}})
    led, laser = p.for_tech("microled"), p.for_tech("laser")
    assert led.rate_fraction(400, 4) == 1.0              # spares absorb
    assert led.rate_fraction(400, 5) == pytest.approx(399 / 400)
    assert led.rate_fraction(400, 104) == pytest.approx(300 / 400)
    assert led.rate_fraction(200, 104) == pytest.approx(100 / 200)   # a 400G link
    assert led.rate_fraction(400, 404) == 0.0
    assert led.rate_fraction(400, 0, link_failed=True) == 0.0
    assert laser.rate_fraction(4, 0) == 1.0 and laser.rate_fraction(4, 1) == 0.0
    st = LaneState(led, 400)
    assert st.total_lanes == 404 and st.check_lane(403) == 403
    with pytest.raises(ValueError):
        st.check_lane(404)
    st.failed.update(range(10))
    assert st.working_lanes == 394 and st.fraction == pytest.approx(394 / 400)
    st = LaneState(led, 200)                             # 400G: one channel is 1/200
    st.failed.update(range(5))
    assert st.working_lanes == 199 and st.fraction == pytest.approx(199 / 200)


# -- failures ---------------------------------------------------------------------------
def test_random_failures_seeded_and_time_compressed():
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="microled")
    p = load_profiles(overrides={"profiles": {"microled": {"lane_fit": 2000.0,
                                                           "repair_h": 100.0}}})
    month = 730.0
    a = random_failures(topo, p, seed=7, horizon_h=month, compression=1e5)
    assert a == random_failures(topo, p, seed=7, horizon_h=month, compression=1e5)
    assert a != random_failures(topo, p, seed=8, horizon_h=month, compression=1e5)
    assert all(0 <= e.t_s < month * 3600 / 1e5 for e in a)   # a month in 26.3 s
    fails = [e for e in a if e.action == "fail_lane"]
    expected = expected_failures(topo, p, month)["lane_failures"]
    # 4 microLED host links at 400G x 200 lanes + 2 leaf-spine links at 800G x 400 lanes,
    # x 2000 FIT x 730 h = 2.3 lane failures expected, plus 4 NVLink links x 18 lanes x
    # 5 FIT x 730 h
    assert expected == pytest.approx((4 * 200 + 2 * 400) * 2000e-9 * month
                                     + 4 * 18 * 5e-9 * month)
    assert 0 <= len(fails) <= 15
    slow = random_failures(topo, p, seed=7, horizon_h=month, compression=1e4)
    assert [e.t_s for e in slow] == pytest.approx([e.t_s * 10 for e in a])
    for e in a:                                           # a repair follows its failure
        if e.action == "repair_lane":
            assert any(f.action == "fail_lane" and f.lane == e.lane and f.t_s < e.t_s and
                       {f.a, f.b} == {e.a, e.b} for f in fails)


def test_many_failures_match_the_rate():
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="laser")
    p = load_profiles(overrides={"profiles": {"laser": {"lane_fit": 1e6, "repair_h": 0.0}}})
    horizon = 1000.0
    events = random_failures(topo, p, seed=1, horizon_h=horizon, compression=3600.0)
    n = sum(1 for e in events if e.action == "fail_lane")
    mean = expected_failures(topo, p, horizon)["lane_failures"]
    # 4 host links at 400G (4 lasers) + 2 leaf-spine links at 800G (8 lasers)
    assert mean == pytest.approx((4 * 4 + 2 * 8) * 1e-3 * 1000 + 4 * 18 * 5e-9 * 1000)
    assert abs(n - mean) < 5 * math.sqrt(mean)


def test_explicit_events_parse_and_are_checked():
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="microled")
    p = load_profiles()
    ev = parse_events([{"link": "leaf0:spine0", "lane": 3, "at_s": 1.0, "repair_s": 2.5},
                       {"link": "s0g0:leaf0", "at_s": 0.5}], topo, p)
    assert ev == [FailureEvent(0.5, "s0g0", "leaf0", "fail_link"),
                  FailureEvent(1.0, "leaf0", "spine0", "fail_lane", 3),
                  FailureEvent(2.5, "leaf0", "spine0", "repair_lane", 3)]
    for bad, field in [({"link": "leaf0:leaf1", "at_s": 1}, "failures[0].link"),
                       ({"link": "leaf0", "at_s": 1}, "failures[0].link"),
                       ({"link": "leaf0:spine0", "lane": 400, "at_s": 1}, "failures[0].lane"),
                       # a 400G host link has 200 channels: lane 200 does not exist
                       ({"link": "s0g0:leaf0", "lane": 200, "at_s": 1}, "failures[0].lane"),
                       ({"link": "leaf0:spine0", "at_s": -1}, "failures[0].at_s"),
                       ({"link": "leaf0:spine0", "at_s": 2, "repair_s": 1},
                        "failures[0].repair_s"),
                       ({"link": "leaf0:spine0", "at_s": 2, "when": 1}, "failures[0]")]:
        with pytest.raises(SpecError) as err:
            parse_events([bad], topo, p)
        assert err.value.field == field


# -- energy and cost ------------------------------------------------------------------------
def test_energy_of_a_fixed_run_equals_the_hand_calculation():
    # 4 GPU-leaf links at 100 Mbit/s (= 400 Gb/s) and 2 leaf-spine links at 200 Mbit/s
    # (= 800 Gb/s), laser: 12 W per end at 800 Gb/s = 8 lanes: 3 W per lit lane (both
    # ends); a 400G link lights 4 lanes.
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="laser")
    p = load_profiles()
    power_w = 4 * (2 * 12.0 * 400 / 800) + 2 * (2 * 12.0)
    assert power_w == 96.0
    e = link_energy(topo, p, measured_s=20.0)
    assert e["techs"]["laser"]["power_w"] == pytest.approx(96.0)
    assert e["techs"]["nvlink"]["power_w"] == 0.0
    assert e["real_s"] == pytest.approx(20.0 / 4000)
    assert "modelled from published per-link power" in e["power_source"]
    assert e["energy_j"] == pytest.approx(96.0 * 20.0 / 4000)         # 0.48 J real
    assert e["energy_j_at_measured_time"] == pytest.approx(96.0 * 20.0)
    led = link_energy(rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="microled"),
                      p, measured_s=20.0)
    assert led["power_w"] == pytest.approx(0.32 * 96.0)                 # 68 % less
    report = energy_report(topo, p, 20.0, {"allreduce": 5.0})
    assert report["jobs"]["allreduce"]["energy_j"] == pytest.approx(96.0 * 5.0 / 4000)


def test_cost_table_counts_switches_ports_transceivers_and_cables():
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, tech="laser")
    t = cost_table(topo, load_profiles())
    assert t["switches"]["leaf"] == {"count": 2, "power_w": 1500.0, "cost_usd": 50000.0}
    assert t["switches"]["spine"]["count"] == 1
    assert t["links"]["laser"] == {"profile": "laser", "links": 6, "lanes": 4 * 4 + 2 * 8,
                                   "ports": 12,
                                   "transceivers": 12, "cables": 6, "power_w": 96.0,
                                   "cost_usd": 7200.0}
    assert t["links"]["nvlink"]["transceivers"] == 0 and t["links"]["nvlink"]["links"] == 4
    assert t["power_w"] == pytest.approx(2250.0 + 96.0)
    copper = cost_table(full_mesh(4), load_profiles())
    assert copper["links"]["copper"]["transceivers"] == 0
    assert copper["links"]["copper"]["cables"] == 6 and copper["switches"] == {}
    text = format_cost_table(t)
    assert text.startswith("# cost and power of rail_optimized") and "link laser" in text
    assert "modelled from published per-link power ([MOSAIC] SIGCOMM 2025)" in text
    assert t["power_source"] in text


def test_a_link_wider_than_the_reference_port_is_costed_as_a_bundle():
    """rail128's leaf-spine links run 1.6 Tb/s (16 x 400G / 4 spines): two 800G ports'
    cables, transceivers and cost each; power stays per lit lane."""
    laser = load_profiles().for_tech("laser")
    assert [ports_for_rate(laser, r) for r in (400.0, 800.0, 801.0, 3200.0)] == [1, 1, 2, 4]
    with pytest.raises(ValueError):
        ports_for_rate(laser, 0.0)
    topo = rail_optimized(servers=16, gpus_per_server=8, spines=4, tech="laser")
    row = cost_table(topo, load_profiles())["links"]["laser"]
    gpu_links, uplinks = 128, 8 * 4
    assert row["links"] == gpu_links + uplinks
    assert row["cables"] == gpu_links + 2 * uplinks
    assert row["ports"] == row["transceivers"] == 2 * row["cables"]
    assert row["cost_usd"] == pytest.approx(1200.0 * row["cables"])
    assert row["power_w"] == pytest.approx(12.0 * gpu_links + 48.0 * uplinks)


# -- rail-optimized vs rail-only at a real cluster's size ---------------------------------
def _gpu_leaf_links(topo: Topology) -> int:
    return sum(1 for a, b in topo.graph.edges
               if {topo.role(a), topo.role(b)} == {"gpu", "leaf"})


def _switch_gbps(topo: Topology, node: str) -> float:
    """Real Gb/s of a switch's fabric ports (its GPU, leaf and spine links together)."""
    return sum(d["rate_mbps"] * topo.scale_factor / 1000
               for _, _, d in topo.graph.edges(node, data=True) if d["tech"] != "nvlink")


def test_rail_fabrics_at_1024_gpus_follow_the_switch_arithmetic():
    """128 servers x 8 GPUs, 51.2 Tb/s switches (128 x 400G): rail-only is one full switch
    per rail; rail-optimized two leaves per rail (64 down, 64 up) and 1024 / 128 = 8
    spines; no switch carries more than 51.2 Tb/s."""
    assert radix() == 128 and GPU_LINK_GBPS == 400.0
    fabrics = rail_fabrics(1024)
    opt, only = fabrics["rail_optimized"], fabrics["rail_only"]
    for topo in (opt, only):
        assert len(topo.nodes_with_role("gpu")) == 1024 == _gpu_leaf_links(topo)
        assert len(topo.nodes_with_role("nvswitch")) == 128
        assert all(_switch_gbps(topo, n) <= SWITCH_GBPS
                   for n in topo.switches() if topo.role(n) != "nvswitch")
    assert only.nodes_with_role("spine") == []
    assert len(only.nodes_with_role("leaf")) == 8
    assert all(only.graph.degree(leaf) == 128 for leaf in only.nodes_with_role("leaf"))
    leaves, spines = opt.nodes_with_role("leaf"), opt.nodes_with_role("spine")
    assert (len(leaves), len(spines)) == (16, 8)
    assert sorted(opt.graph.nodes[n]["rail"] for n in leaves) == sorted(list(range(8)) * 2)
    for leaf in leaves:                      # non-blocking: as much up as down
        down = [p for p in opt.graph.adj[leaf] if opt.role(p) == "gpu"]
        assert len(down) == 64
        assert _switch_gbps(opt, leaf) == pytest.approx(2 * 64 * 400.0)
    assert opt.graph.edges["leaf0", "spine0"]["rate_mbps"] * 4000 / 1000 == 3200.0
    assert all(_switch_gbps(opt, s) == pytest.approx(SWITCH_GBPS) for s in spines)
    assert AT_SCALE_GPUS == 1024


def test_rail_only_cut_at_scale_is_cost_table_of_those_specs():
    """The cut is 1 - rail-only / rail-optimized of cost_table() of rail_fabrics(), with
    the profiles given; by hand at 1024 GPUs (switch 25000 USD, 750 W; 400G laser link
    1200 USD, 12 W; a 3.2 Tb/s leaf-spine link = 4 x 800G: 4800 USD, 96 W)."""
    p = load_profiles()
    cut = rail_only_cut(1024, p)
    tables = {n: cost_table(t, p) for n, t in rail_fabrics(1024).items()}
    assert cut["tables"] == tables
    assert (cut["gpus"], cut["gpus_per_server"], cut["radix"]) == (1024, 8, 128)
    only_usd, opt_usd = 8 * 25000 + 1024 * 1200, 24 * 25000 + (1024 + 128 * 4) * 1200
    only_w, opt_w = 8 * 750 + 1024 * 12, 24 * 750 + 1024 * 12 + 128 * 96
    assert (tables["rail_only"]["cost_usd"], tables["rail_optimized"]["cost_usd"]) == \
        pytest.approx((only_usd, opt_usd))
    assert (tables["rail_only"]["power_w"], tables["rail_optimized"]["power_w"]) == \
        pytest.approx((only_w, opt_w))
    assert cut["cost_cut_percent"] == pytest.approx(100 * (1 - only_usd / opt_usd))  # 41.5
    assert cut["power_cut_percent"] == pytest.approx(100 * (1 - only_w / opt_w))     # 57.0
    assert cut["cost_cut_percent"] == pytest.approx(cut_percent(tables, "cost_usd"))
    # free spines: the cut shrinks, so it follows the profiles, not a constant
    free = load_profiles(overrides={"switches": {"spine": {"cost_usd": 0.0}}})
    assert rail_only_cut(1024, free)["cost_cut_percent"] == \
        pytest.approx(100 * (1 - only_usd / (opt_usd - 8 * 25000)))


def test_rail_fabrics_refuse_what_the_builders_cannot_wire():
    # 4096 GPUs: a rail of 512 GPUs is four 128-port switches, a Clos per rail
    with pytest.raises(SpecError, match="Clos per rail") as err:
        rail_fabrics(4096)
    assert err.value.field == "gpus"
    with pytest.raises(SpecError, match="whole number of 8-GPU servers"):
        rail_fabrics(1020)
    # a 25.6 Tb/s switch (64 x 400G): 512 GPUs fit, two leaves per rail and 8 spines
    small = rail_fabrics(512, switch_gbps=25_600.0)["rail_optimized"]
    assert small.params["leaves_per_rail"] == 2 and len(small.nodes_with_role("spine")) == 8
