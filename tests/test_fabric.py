"""Fabrics on real namespaces: reachability, paths on the wire, ECMP, shaping, sysctls."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess

import pytest
from pyroute2.netlink.rtnl.ndmsg import NUD_PERMANENT

from fabric import netns
from fabric.checks import check_fabric, ecmp_spread
from fabric.probe import ping_all, trace
from fabric.shaping import configured_rate_mbps, queue_stats
from topologies import full_mesh, leaf_spine, one_tier, rail_only, rail_optimized

from .conftest import link_counters, process, udp_socket_in, wait_for

pytestmark = pytest.mark.root

SMALL = {
    "rail_optimized": lambda: rail_optimized(servers=2, gpus_per_server=2, spines=2),
    "rail_only": lambda: rail_only(servers=2, gpus_per_server=3),
    "one_tier": lambda: one_tier(nodes=4, planes=2),
    "full_mesh": lambda: full_mesh(nodes=4),
    "leaf_spine": lambda: leaf_spine(leaves=2, spines=2, hosts_per_leaf=2),
}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_every_endpoint_reaches_every_other(fabric, kind):
    fab = fabric(SMALL[kind]())
    reach = ping_all(fab, fab.topo.endpoints())
    assert reach and all(reach.values()), [p for p, ok in reach.items() if not ok]
    ok, text = check_fabric(fab)
    assert ok, text


def test_rail_optimized_paths_on_the_wire(fabric):
    fab = fabric(rail_optimized(servers=3, gpus_per_server=2, spines=2))
    role = fab.topo.role
    assert trace(fab, "s0g0", "s2g0") == ["s0g0", "leaf0", "s2g0"]      # same rail
    assert trace(fab, "s1g0", "s1g1") == ["s1g0", "nvs1", "s1g1"]       # same server
    for sport in range(40000, 40008):                                          # cross rail
        hops = trace(fab, "s0g0", "s2g1", sport=sport)
        assert [role(n) for n in hops] == ["gpu", "leaf", "spine", "leaf", "gpu"]
        assert hops[1] == "leaf0" and hops[3] == "leaf1"


def test_rail_only_crosses_nvlink_never_a_spine(fabric):
    fab = fabric(rail_only(servers=2, gpus_per_server=3))
    for a, b, mid in (("s0g0", "s1g2", "s0g2"), ("s1g1", "s0g0", "s1g0")):
        hops = trace(fab, a, b)
        server = a[1]
        assert hops == [a, f"nvs{server}", mid, f"leaf{b[-1]}", b]
        assert "spine" not in {fab.topo.role(n) for n in hops}
    assert netns.read_sysctl(fab.ns("s0g2"), "net.ipv4.ip_forward") == "1"  # GPUs forward (PXN)


def test_one_tier_is_one_switch_hop_and_full_mesh_is_direct(fabric):
    fab = fabric(one_tier(nodes=4, planes=2))
    for sport in range(40000, 40016):
        hops = trace(fab, "cpu0", "cpu3", sport=sport)
        assert len(hops) == 3 and fab.topo.role(hops[1]) == "plane"


def test_full_mesh_is_direct(fabric):
    fab = fabric(full_mesh(nodes=4))
    assert trace(fab, "cpu0", "cpu3") == ["cpu0", "cpu3"]
    assert netns.read_sysctl(fab.ns("cpu0"), "net.ipv4.ip_forward") == "0"


def test_leaf_route_has_one_next_hop_per_spine(fabric):
    fab = fabric(leaf_spine(leaves=2, spines=3, hosts_per_leaf=1))
    target = fab.plan.loopback["l1h0"]
    with fab.ipr("leaf0") as ipr:   # the longest prefix that holds the target decides
        route = max((r for r in ipr.get_routes(family=socket.AF_INET, table=254)
                     if r.get_attr("RTA_DST") and ipaddress.ip_address(target) in
                     ipaddress.ip_network(f"{r.get_attr('RTA_DST')}/{r['dst_len']}")),
                    key=lambda r: r["dst_len"])
        gateways = {nh.get_attr("RTA_GATEWAY") for nh in route.get_attr("RTA_MULTIPATH")}
    spines = {fab.plan.port("leaf0", f"spine{j}").peer_address for j in range(3)}
    assert gateways == spines
    assert netns.read_sysctl(fab.ns("leaf0"), "net.ipv4.fib_multipath_hash_policy") == "1"
    if fab.seed_supported:
        assert netns.read_sysctl(fab.ns("leaf0"), "net.ipv4.fib_multipath_hash_seed") == "1"


def _spine_rx(fab, spines) -> dict[str, int]:
    port = {s: fab.plan.port(s, "leaf0").ifname for s in spines}
    return {s: link_counters(fab, s)[port[s]]["rx_packets"] for s in spines}


def test_udp_source_ports_spread_over_spines_by_counters(fabric):
    fab = fabric(leaf_spine(leaves=2, spines=2, hosts_per_leaf=1))
    dst = (fab.plan.loopback["l1h0"], 4791)
    spines = ["spine0", "spine1"]
    sock = udp_socket_in(fab, "l0h0")
    try:
        before = _spine_rx(fab, spines)
        n = 400
        for sport in range(41000, 41000 + n):   # a new 5-tuple per packet: spraying
            sprayer = udp_socket_in(fab, "l0h0")
            sprayer.bind((fab.plan.loopback["l0h0"], sport))
            sprayer.sendto(b"x" * 64, dst)
            sprayer.close()
        spread = {s: v - before[s] for s, v in
                  wait_for(lambda: _settled(fab, spines, before, n), timeout_s=3).items()}
        assert sum(spread.values()) >= n
        assert min(spread.values()) > 0.3 * n, spread      # both spines carry a fair share
        before = _spine_rx(fab, spines)
        for _ in range(n):                                  # one 5-tuple: one path
            sock.sendto(b"y" * 64, dst)
        one = {s: v - before[s] for s, v in
               wait_for(lambda: _settled(fab, spines, before, n), timeout_s=3).items()}
        assert max(one.values()) >= n and min(one.values()) <= 2, one
    finally:
        sock.close()


def _settled(fab, spines, before, n):
    now = _spine_rx(fab, spines)
    return now if sum(now[s] - before[s] for s in spines) >= n else None


def test_traced_ecmp_uses_every_spine(fabric):
    fab = fabric(rail_optimized(servers=2, gpus_per_server=2, spines=2))
    spread = ecmp_spread(fab, "s0g0", "s1g1")
    assert set(spread) == {"spine0", "spine1"}


@pytest.mark.parametrize("rate_mbps", [50.0, 200.0])
def test_shaped_rate_within_10_percent(fabric, rate_mbps):
    fab = fabric(leaf_spine(leaves=1, spines=1, hosts_per_leaf=2, rate_mbps=rate_mbps))
    server, client = "l0h1", "l0h0"
    with fab.ipr(client) as ipr:
        index = ipr.link_lookup(ifname=fab.plan.port(client, "leaf0").ifname)[0]
        assert configured_rate_mbps(ipr, index) == pytest.approx(rate_mbps, rel=1e-3)
    addr = fab.plan.loopback[server]
    with process(fab, server, ["iperf3", "-s", "-1", "-B", addr]):
        out = wait_for(lambda: _iperf(fab, client, addr), timeout_s=10, interval_s=0.2)
    measured = out["end"]["sum_received"]["bits_per_second"] / 1e6
    assert measured == pytest.approx(rate_mbps, rel=0.10), measured
    with fab.ipr("leaf0") as ipr:
        index = ipr.link_lookup(ifname=fab.plan.port("leaf0", server).ifname)[0]
        assert queue_stats(ipr, index)["sent_bytes"] > 0


def _iperf(fab, client, addr):
    proc = fab.popen(client, ["iperf3", "-c", addr, "-t", "3", "-O", "1", "-J"])  # -O: slow start
    out, _ = proc.communicate(timeout=30)
    data = json.loads(out) if out.strip() else {}
    return data if "end" in data and "sum_received" in data["end"] else None


def test_every_port_shaped_jumbo_and_up(fabric):
    fab = fabric(rail_optimized(servers=2, gpus_per_server=2, spines=1))
    for node in fab.topo.graph.nodes:
        with fab.ipr(node) as ipr:
            links = {lk.get_attr("IFLA_IFNAME"): lk for lk in ipr.get_links()}
            for port in fab.plan.ports[node]:
                link = links[port.ifname]
                assert link.get_attr("IFLA_MTU") == 9000
                assert link.get_attr("IFLA_OPERSTATE") == "UP"
                rate = fab.topo.graph.edges[node, port.peer]["rate_mbps"]
                assert configured_rate_mbps(ipr, link["index"]) == pytest.approx(rate, rel=1e-3)


def permanent_neighbours(ipr, index: int) -> dict[str, str]:
    """address -> MAC of the permanent neighbour entries on port `index`."""
    return {n.get_attr("NDA_DST"): n.get_attr("NDA_LLADDR")
            for n in ipr.get_neighbours(ifindex=index) if n["state"] == NUD_PERMANENT}


def test_every_port_has_its_planned_mac_and_its_peer_as_permanent_neighbour(fabric):
    fab = fabric(rail_optimized(servers=2, gpus_per_server=2, spines=1))
    for node in fab.topo.graph.nodes:
        with fab.ipr(node) as ipr:
            for port in fab.plan.ports[node]:
                (link,) = ipr.get_links(ifname=port.ifname)
                assert link.get_attr("IFLA_ADDRESS") == port.mac
                assert permanent_neighbours(ipr, link["index"]) == {
                    port.peer_address: port.peer_mac}
    # and nobody resolves anything: after traffic across the fabric every neighbour
    # entry on every node is still one of the permanent ones (ARP would add others)
    src, dst = fab.topo.endpoints()[0], fab.topo.endpoints()[-1]
    proc = fab.popen(src, ["ping", "-c", "3", "-i", "0.2", "-W", "1", fab.plan.loopback[dst]])
    proc.communicate(timeout=10)
    assert proc.returncode == 0
    for node in fab.topo.graph.nodes:
        with fab.ipr(node) as ipr:
            states = [n["state"] for n in ipr.get_neighbours() if n["family"] == socket.AF_INET]
        assert states and all(s == NUD_PERMANENT for s in states), (node, states)


def _kernel_log() -> list[str]:
    out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()


def test_shaping_at_any_rate_leaves_no_kernel_warning(fabric):
    before = len(_kernel_log())
    topo = rail_optimized(servers=2, gpus_per_server=2, spines=1, rate_mbps=1.0,
                          nvlink_rate_mbps=5000.0)
    fabric(topo)
    new = _kernel_log()[before:]
    assert not [line for line in new if "htb" in line.lower() or "quantum" in line.lower()]
