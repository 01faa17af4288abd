"""Topology specs, addressing and routes: pure data, no root."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from fabric.addressing import FABRIC_NET, mac_for, plan
from fabric.checks import expected_paths
from fabric.routing import compute_routes, path
from topologies import (
    SpecError,
    build,
    full_mesh,
    leaf_spine,
    one_tier,
    rail_only,
    rail_optimized,
    resolve,
)
from topologies.files import TOPOLOGY_DIR, load_file, parse_assignments


def test_rail_optimized_wiring():
    t = rail_optimized(servers=3, gpus_per_server=4, spines=2, oversubscription=2.0)
    g = t.graph
    assert len(t.nodes_with_role("gpu")) == 12
    assert len(t.nodes_with_role("leaf")) == 4
    assert len(t.nodes_with_role("nvswitch")) == 3
    for s, k in itertools.product(range(3), range(4)):
        gpu = f"s{s}g{k}"
        assert set(g.adj[gpu]) == {f"leaf{k}", f"nvs{s}"}   # GPU k on the leaf of rail k
        assert g.edges[gpu, f"nvs{s}"]["tech"] == "nvlink"
        assert g.edges[gpu, f"nvs{s}"]["rate_mbps"] > g.edges[gpu, f"leaf{k}"]["rate_mbps"]
    # leaf uplinks carry downlink capacity / oversubscription, shared over the spines
    assert g.edges["leaf0", "spine0"]["rate_mbps"] == pytest.approx(3 * 100 / 2.0 / 2)
    assert all(set(g.adj[f"spine{j}"]) == {f"leaf{k}" for k in range(4)} for j in range(2))


def test_rail_optimized_splits_a_rail_over_its_leaves():
    """A rail wider than one switch: 4 servers over 2 leaves per rail, each leaf with 2
    downlinks and 2 x 100 Mbit/s of uplink shared over the spines."""
    t = rail_optimized(servers=4, gpus_per_server=2, spines=2, leaves_per_rail=2)
    g = t.graph
    assert len(t.nodes_with_role("leaf")) == 4
    assert [g.nodes[f"leaf{j}"]["rail"] for j in range(4)] == [0, 0, 1, 1]
    assert set(g.adj["leaf0"]) == {"s0g0", "s1g0", "spine0", "spine1"}
    assert set(g.adj["leaf3"]) == {"s2g1", "s3g1", "spine0", "spine1"}
    assert g.edges["leaf0", "spine1"]["rate_mbps"] == pytest.approx(2 * 100 / 2)
    assert t.params["leaves_per_rail"] == 2
    one = rail_optimized(servers=4, gpus_per_server=2, spines=2)
    assert set(one.graph.adj["leaf1"]) == {f"s{s}g1" for s in range(4)} | {"spine0", "spine1"}


def test_path_checks_hold_on_the_routes_when_a_rail_spans_leaves():
    """fabric.checks promises one leaf hop within a rail: only between GPUs of one leaf."""
    t = rail_optimized(servers=4, gpus_per_server=2, spines=2, leaves_per_rail=2)
    r = compute_routes(t)
    checks = expected_paths(t)
    same_rail = next(c for c in checks if c.what == "same rail: one leaf hop")
    assert (same_rail.src, same_rail.dst) == ("s0g0", "s1g0")
    assert all(c.ok(path(t, r, c.src, c.dst)) for c in checks)


def test_rail_only_has_no_spine_and_gpus_forward():
    t = rail_only(servers=2, gpus_per_server=2)
    assert t.nodes_with_role("spine") == []
    assert all(t.graph.nodes[g]["forwards"] for g in t.nodes_with_role("gpu"))
    assert t.prefer_nvlink


def test_one_tier_full_mesh_leaf_spine_shapes():
    t = one_tier(nodes=5, planes=3)
    assert all(t.graph.degree(f"cpu{i}") == 3 for i in range(5))
    assert all(t.graph.degree(f"plane{p}") == 5 for p in range(3))
    m = full_mesh(nodes=5)
    assert m.switches() == [] and m.graph.number_of_edges() == 10
    ls = leaf_spine(leaves=3, spines=2, hosts_per_leaf=2)
    assert len(ls.endpoints()) == 6 and ls.graph.number_of_edges() == 6 + 6


@pytest.mark.parametrize("name", ["rail_optimized", "rail_only", "one_tier", "full_mesh",
                                  "leaf_spine", "rail128"])
def test_shipped_files_load(name):
    t = load_file(TOPOLOGY_DIR / f"{name}.toml")
    assert t.name == name and t.graph.number_of_nodes() > 0
    assert resolve(name).summary() == t.summary()


def test_rail128_is_the_benchmark_size():
    t = resolve("rail128")
    assert len(t.endpoints()) == 128


@pytest.mark.parametrize(("kind", "params", "field"), [
    ("rail_optimized", {"servers": 0}, "servers"),
    ("rail_optimized", {"spines": -1}, "spines"),
    ("rail_optimized", {"oversubscription": 0}, "oversubscription"),
    ("rail_optimized", {"rate_mbps": -5}, "rate_mbps"),
    ("rail_optimized", {"gpus_per_server": 2.5}, "gpus_per_server"),
    ("rail_optimized", {"servers": 3, "leaves_per_rail": 2}, "leaves_per_rail"),
    ("rail_optimized", {"leaves_per_rail": 0}, "leaves_per_rail"),
    ("rail_only", {"nvlink_rate_mbps": 0}, "nvlink_rate_mbps"),
    ("one_tier", {"planes": 0}, "planes"),
    ("one_tier", {"nodes": 1}, "nodes"),
    ("full_mesh", {"nodes": True}, "nodes"),
    ("leaf_spine", {"queue_bytes": 100}, "queue_bytes"),
    ("leaf_spine", {"tech": "smoke_signals"}, "tech"),
    ("leaf_spine", {"colour": "red"}, "params.colour"),
    ("no_such_kind", {}, "kind"),
])
def test_bad_input_names_the_field(kind, params, field):
    with pytest.raises(SpecError) as err:
        build(kind, params)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


@pytest.mark.parametrize("name", ["9lives", "has space", "semi;colon", "x" * 40, ""])
def test_names_must_be_plain_identifiers(name):
    with pytest.raises(SpecError) as err:
        build("full_mesh", {}, name=name)
    assert err.value.field == "name"


def test_bad_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("kind = 'full_mesh\n")
    with pytest.raises(SpecError, match="does not parse"):
        load_file(bad)
    with pytest.raises(SpecError, match="no such file"):
        load_file(tmp_path / "missing.toml")
    extra = tmp_path / "extra.toml"
    extra.write_text("kind = 'full_mesh'\nnodez = 3\n")
    with pytest.raises(SpecError) as err:
        load_file(extra)
    assert err.value.field == "nodez"
    with pytest.raises(SpecError) as err:
        resolve("not_a_topology")
    assert err.value.field == "topology"


def test_parse_assignments():
    assert parse_assignments(["servers=4", "oversubscription=1.5", "tech=copper"]) == {
        "servers": 4, "oversubscription": 1.5, "tech": "copper"}
    with pytest.raises(SpecError):
        parse_assignments(["servers"])


def test_interface_names_fit_ifnamsiz():
    for t in (resolve("rail128"), one_tier(nodes=64, planes=4), full_mesh(nodes=20)):
        for node in t.graph.nodes:
            assert all(len(p.ifname) <= 15 for p in plan(t).ports[node])


def test_addresses_unique_and_in_rfc2544_range():
    t = resolve("rail128")
    p = plan(t)
    addrs = [port.address for ports in p.ports.values() for port in ports]
    addrs += list(p.loopback.values())
    assert len(addrs) == len(set(addrs))
    assert all(ipaddress.ip_address(a) in FABRIC_NET for a in addrs)
    for ports in p.ports.values():  # the two ends of a link share one /31
        for port in ports:
            a = ipaddress.ip_interface(f"{port.address}/31")
            assert ipaddress.ip_address(port.peer_address) in a.network


def test_port_macs_unique_unicast_and_locally_administered():
    p = plan(resolve("rail128"))
    macs = [port.mac for ports in p.ports.values() for port in ports]
    assert len(macs) == len(set(macs))
    assert all(int(m[:2], 16) & 0b11 == 0b10 for m in macs)   # local, unicast
    port = p.ports["s0g0"][0]
    assert p.port(port.peer, "s0g0").mac == port.peer_mac
    assert mac_for("198.18.1.2") == "02:00:c6:12:01:02"
    with pytest.raises(ValueError, match="not a link address"):
        mac_for("198.19.0.1")


def test_routes_follow_the_promised_paths():
    t = rail_optimized(servers=3, gpus_per_server=3, spines=3)
    r = compute_routes(t)
    assert set(r["leaf0"]["s1g2"]) == {"spine0", "spine1", "spine2"}   # ECMP over spines
    assert r["s0g0"]["s0g2"] == ("nvs0",)
    assert path(t, r, "s0g0", "s2g0") == ["s0g0", "leaf0", "s2g0"]
    for a, b in itertools.permutations(t.endpoints(), 2):
        hops = path(t, r, a, b)
        assert not any(t.role(n) == "gpu" for n in hops[1:-1])          # GPUs never transit
    ro = rail_only(servers=3, gpus_per_server=3)
    rr = compute_routes(ro)
    assert path(ro, rr, "s0g0", "s2g1") == ["s0g0", "nvs0", "s0g1", "leaf1", "s2g1"]  # PXN
    for a, b in itertools.permutations(ro.endpoints(), 2):
        assert "spine" not in {ro.role(n) for n in path(ro, rr, a, b)}
    ot = one_tier(nodes=4, planes=2)
    assert compute_routes(ot)["cpu0"]["cpu3"] == ("plane0", "plane1")
    fm = full_mesh(nodes=4)
    assert compute_routes(fm)["cpu0"]["cpu3"] == ("cpu3",)


def test_rates_between_what_htb_shapes():
    from topologies.spec import MAX_RATE_MBPS, MIN_RATE_MBPS, check_rate
    assert check_rate("rate_mbps", MIN_RATE_MBPS) == MIN_RATE_MBPS
    assert check_rate("rate_mbps", MAX_RATE_MBPS) == MAX_RATE_MBPS
    for rate in (0, 1e-9, MIN_RATE_MBPS / 2, MAX_RATE_MBPS * 2):
        with pytest.raises(SpecError, match="minimum 0.1, maximum 32000"):
            check_rate("rate_mbps", rate)


def test_only_regular_files_are_read(tmp_path):
    import os
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="is a FIFO, not a regular file"):
        load_file(fifo)              # refused from its stat: never opened, never waits
    with pytest.raises(SpecError, match="character device"):
        load_file("/dev/zero")
