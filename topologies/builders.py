"""Topology builders: parameters in, validated Topology out. No root, no kernel state.

Naming: GPU k of server s is `s<s>g<k>`, its server's NVSwitch `nvs<s>`, the leaf of
rail k `leaf<k>` (with L leaves per rail, rail k's are `leaf<k L>`..`leaf<k L + L - 1>`),
spines `spine<j>`, CPU nodes `cpu<i>`, parallel switches of a one-tier mesh
`plane<p>`, hosts of a leaf-spine `l<leaf>h<i>`.
"""

from __future__ import annotations

import networkx as nx

from topologies.spec import (
    DEFAULT_LENGTH_M,
    DEFAULT_NVLINK_RATE_MBPS,
    DEFAULT_QUEUE_BYTES,
    DEFAULT_RATE_MBPS,
    DEFAULT_SCALE_FACTOR,
    TECHS,
    SpecError,
    Topology,
    check_count,
    check_name,
    check_positive,
    check_queue,
    check_rate,
    check_size,
)

# Typical cable lengths, metres: inside a rack, across a row, across a hall.
IN_RACK_M = DEFAULT_LENGTH_M
ROW_M = 10.0
HALL_M = 30.0
NVLINK_M = 0.3


def _link(g: nx.Graph, a: str, b: str, rate_mbps: float, tech: str, length_m: float,
          queue_bytes: int) -> None:
    g.add_edge(a, b, rate_mbps=float(rate_mbps), tech=tech, length_m=float(length_m),
               queue_bytes=int(queue_bytes))


def _common(name: str, rate_mbps: float, queue_bytes: int, scale_factor: float,
            tech: str) -> None:
    check_name("name", name)
    check_rate("rate_mbps", rate_mbps)
    check_queue("queue_bytes", queue_bytes)
    check_positive("scale_factor", scale_factor)
    if tech not in TECHS - {"nvlink"}:
        raise SpecError("tech", f"{tech!r} is not one of {sorted(TECHS - {'nvlink'})}")


def _servers_with_nvlink(g: nx.Graph, servers: int, gpus: int, nvlink_rate_mbps: float,
                         queue_bytes: int, gpu_forwards: bool) -> None:
    for s in range(servers):
        nvs = f"nvs{s}"
        g.add_node(nvs, role="nvswitch", server=s, rail=None, forwards=True)
        for k in range(gpus):
            gpu = f"s{s}g{k}"
            g.add_node(gpu, role="gpu", server=s, rail=k, forwards=gpu_forwards)
            _link(g, gpu, nvs, nvlink_rate_mbps, "nvlink", NVLINK_M, queue_bytes)


def rail_optimized(servers: int = 4, gpus_per_server: int = 4, spines: int = 2,
                   oversubscription: float = 1.0, leaves_per_rail: int = 1, *,
                   name: str = "rail_optimized", rate_mbps: float = DEFAULT_RATE_MBPS,
                   nvlink_rate_mbps: float = DEFAULT_NVLINK_RATE_MBPS,
                   queue_bytes: int = DEFAULT_QUEUE_BYTES,
                   scale_factor: float = DEFAULT_SCALE_FACTOR,
                   tech: str = "laser") -> Topology:
    """GPU k of every server on a leaf of rail k; every leaf joined to every spine.

    A rail is L = `leaves_per_rail` leaves (more than one where a rail has more GPUs
    than one switch has ports): GPU k of server s on leaf k L + s // (servers / L), so
    each leaf has servers / L downlinks at `rate_mbps`. A leaf's uplinks share its
    downlink capacity / oversubscription equally over the spines.
    """
    check_count("servers", servers, 1)
    check_count("gpus_per_server", gpus_per_server, 1)
    check_count("spines", spines, 1)
    check_positive("oversubscription", oversubscription)
    check_count("leaves_per_rail", leaves_per_rail, 1)
    check_rate("nvlink_rate_mbps", nvlink_rate_mbps)
    _common(name, rate_mbps, queue_bytes, scale_factor, tech)
    if servers * gpus_per_server < 2:
        raise SpecError("servers", "servers x gpus_per_server must be at least 2")
    if servers % leaves_per_rail:
        raise SpecError("leaves_per_rail", f"{servers} servers do not split evenly over "
                        f"{leaves_per_rail} leaves per rail")
    gpus = servers * gpus_per_server
    leaves = gpus_per_server * leaves_per_rail
    check_size("servers", gpus + servers + leaves + spines, 2 * gpus + leaves * spines)
    g = nx.Graph()
    _servers_with_nvlink(g, servers, gpus_per_server, nvlink_rate_mbps, queue_bytes, False)
    per_leaf = servers // leaves_per_rail
    uplink_mbps = per_leaf * rate_mbps / oversubscription / spines
    for k in range(gpus_per_server):
        for i in range(leaves_per_rail):
            leaf = f"leaf{k * leaves_per_rail + i}"
            g.add_node(leaf, role="leaf", server=None, rail=k, forwards=True)
            for s in range(i * per_leaf, (i + 1) * per_leaf):
                _link(g, f"s{s}g{k}", leaf, rate_mbps, tech, ROW_M, queue_bytes)
    for j in range(spines):
        spine = f"spine{j}"
        g.add_node(spine, role="spine", server=None, rail=None, forwards=True)
        for leaf_i in range(leaves):
            _link(g, f"leaf{leaf_i}", spine, uplink_mbps, tech, HALL_M, queue_bytes)
    params = {"servers": servers, "gpus_per_server": gpus_per_server, "spines": spines,
              "oversubscription": oversubscription, "leaves_per_rail": leaves_per_rail,
              "rate_mbps": rate_mbps, "nvlink_rate_mbps": nvlink_rate_mbps,
              "queue_bytes": queue_bytes, "tech": tech}
    return Topology(name, "rail_optimized", g, params, scale_factor).validate()


def rail_only(servers: int = 4, gpus_per_server: int = 4, *, name: str = "rail_only",
              rate_mbps: float = DEFAULT_RATE_MBPS,
              nvlink_rate_mbps: float = DEFAULT_NVLINK_RATE_MBPS,
              queue_bytes: int = DEFAULT_QUEUE_BYTES,
              scale_factor: float = DEFAULT_SCALE_FACTOR, tech: str = "laser") -> Topology:
    """Rail-optimized without spines (Wang et al. 2023).

    A GPU reaches another rail only through its server's NVLink domain (PXN):
    GPU i of A -> NVSwitch of A -> GPU j of A -> leaf j -> GPU j of B. GPUs forward.
    """
    check_count("servers", servers, 1)
    check_count("gpus_per_server", gpus_per_server, 1)
    check_rate("nvlink_rate_mbps", nvlink_rate_mbps)
    _common(name, rate_mbps, queue_bytes, scale_factor, tech)
    if servers * gpus_per_server < 2:
        raise SpecError("servers", "servers x gpus_per_server must be at least 2")
    gpus = servers * gpus_per_server
    check_size("servers", gpus + servers + gpus_per_server, 2 * gpus)
    g = nx.Graph()
    _servers_with_nvlink(g, servers, gpus_per_server, nvlink_rate_mbps, queue_bytes, True)
    for k in range(gpus_per_server):
        leaf = f"leaf{k}"
        g.add_node(leaf, role="leaf", server=None, rail=k, forwards=True)
        for s in range(servers):
            _link(g, f"s{s}g{k}", leaf, rate_mbps, tech, ROW_M, queue_bytes)
    params = {"servers": servers, "gpus_per_server": gpus_per_server, "rate_mbps": rate_mbps,
              "nvlink_rate_mbps": nvlink_rate_mbps, "queue_bytes": queue_bytes, "tech": tech}
    return Topology(name, "rail_only", g, params, scale_factor, prefer_nvlink=True).validate()


def one_tier(nodes: int = 8, planes: int = 2, *, name: str = "one_tier",
             rate_mbps: float = DEFAULT_RATE_MBPS, queue_bytes: int = DEFAULT_QUEUE_BYTES,
             scale_factor: float = DEFAULT_SCALE_FACTOR, tech: str = "laser") -> Topology:
    """CPU nodes with one port into each of `planes` parallel non-blocking switches."""
    check_count("nodes", nodes, 2)
    check_count("planes", planes, 1)
    _common(name, rate_mbps, queue_bytes, scale_factor, tech)
    check_size("nodes", nodes + planes, nodes * planes)
    g = nx.Graph()
    for i in range(nodes):
        g.add_node(f"cpu{i}", role="cpu", server=None, rail=None, forwards=False)
    for p in range(planes):
        plane = f"plane{p}"
        g.add_node(plane, role="plane", server=None, rail=None, forwards=True)
        for i in range(nodes):
            _link(g, f"cpu{i}", plane, rate_mbps, tech, ROW_M, queue_bytes)
    params = {"nodes": nodes, "planes": planes, "rate_mbps": rate_mbps,
              "queue_bytes": queue_bytes, "tech": tech}
    return Topology(name, "one_tier", g, params, scale_factor).validate()


def full_mesh(nodes: int = 4, *, name: str = "full_mesh", rate_mbps: float = DEFAULT_RATE_MBPS,
              queue_bytes: int = DEFAULT_QUEUE_BYTES,
              scale_factor: float = DEFAULT_SCALE_FACTOR, tech: str = "copper") -> Topology:
    """CPU nodes wired directly to each other: no switch at all."""
    check_count("nodes", nodes, 2)
    _common(name, rate_mbps, queue_bytes, scale_factor, tech)
    check_size("nodes", nodes, nodes * (nodes - 1) // 2)
    g = nx.Graph()
    for i in range(nodes):
        g.add_node(f"cpu{i}", role="cpu", server=None, rail=None, forwards=False)
    for i in range(nodes):
        for j in range(i + 1, nodes):
            _link(g, f"cpu{i}", f"cpu{j}", rate_mbps, tech, IN_RACK_M, queue_bytes)
    params = {"nodes": nodes, "rate_mbps": rate_mbps, "queue_bytes": queue_bytes, "tech": tech}
    return Topology(name, "full_mesh", g, params, scale_factor).validate()


def leaf_spine(leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 2, *,
               name: str = "leaf_spine", rate_mbps: float = DEFAULT_RATE_MBPS,
               uplink_rate_mbps: float | None = None,
               queue_bytes: int = DEFAULT_QUEUE_BYTES,
               scale_factor: float = DEFAULT_SCALE_FACTOR, tech: str = "laser") -> Topology:
    """The classic two-tier Clos: hosts on leaves, every leaf on every spine."""
    check_count("leaves", leaves, 1)
    check_count("spines", spines, 1)
    check_count("hosts_per_leaf", hosts_per_leaf, 1)
    _common(name, rate_mbps, queue_bytes, scale_factor, tech)
    uplink = rate_mbps if uplink_rate_mbps is None else check_rate(
        "uplink_rate_mbps", uplink_rate_mbps)
    if leaves * hosts_per_leaf < 2:
        raise SpecError("hosts_per_leaf", "leaves x hosts_per_leaf must be at least 2")
    check_size("hosts_per_leaf", leaves * (hosts_per_leaf + 1) + spines,
               leaves * (hosts_per_leaf + spines))
    g = nx.Graph()
    for leaf_i in range(leaves):
        leaf = f"leaf{leaf_i}"
        g.add_node(leaf, role="leaf", server=None, rail=None, forwards=True)
        for h in range(hosts_per_leaf):
            host = f"l{leaf_i}h{h}"
            g.add_node(host, role="cpu", server=None, rail=None, forwards=False)
            _link(g, host, leaf, rate_mbps, tech, IN_RACK_M, queue_bytes)
    for j in range(spines):
        spine = f"spine{j}"
        g.add_node(spine, role="spine", server=None, rail=None, forwards=True)
        for leaf_i in range(leaves):
            _link(g, f"leaf{leaf_i}", spine, uplink, tech, HALL_M, queue_bytes)
    params = {"leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf,
              "rate_mbps": rate_mbps, "uplink_rate_mbps": uplink,
              "queue_bytes": queue_bytes, "tech": tech}
    return Topology(name, "leaf_spine", g, params, scale_factor).validate()


BUILDERS = {
    "rail_optimized": rail_optimized,
    "rail_only": rail_only,
    "one_tier": one_tier,
    "full_mesh": full_mesh,
    "leaf_spine": leaf_spine,
}
