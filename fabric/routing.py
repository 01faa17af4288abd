"""Route computation (pure data): all shortest paths of the graph as next-hop sets.

For every destination node, a breadth-first search from it over the nodes that
forward (switches, and GPUs in rail-only) gives each node's distance; a node's next
hops toward that destination are all its neighbours one step closer, which is ECMP
over every shortest path. Endpoints that do not forward are never transit.

Rail-only (PXN): where a GPU has equal-cost next hops through its NVLink domain and
through its rail, it keeps only the NVLink ones, so cross-rail traffic first crosses
the server's NVSwitch to the GPU on the destination's rail, then that rail.
"""

from __future__ import annotations

import networkx as nx

from topologies.spec import Topology

Routes = dict[str, dict[str, tuple[str, ...]]]  # node -> destination node -> next hops


def compute_routes(topo: Topology) -> Routes:
    g = topo.graph
    forwards = nx.get_node_attributes(g, "forwards")
    both_ways = g.to_directed(as_view=True)
    routes: Routes = {node: {} for node in g.nodes}
    for dest in g.nodes:
        # a breadth-first search from dest that leaves only dest and the forwarding nodes:
        # a node's predecessors in it are its neighbours one step closer that may carry on
        onward = nx.subgraph_view(
            both_ways, filter_edge=lambda a, _b, dest=dest: a == dest or forwards[a])
        for node, closer in nx.predecessor(onward, dest).items():
            if node == dest:
                continue
            hops = tuple(p for p in g.adj[node] if p in closer)   # in adjacency order
            if topo.prefer_nvlink and g.nodes[node]["role"] == "gpu":
                nvlink = tuple(p for p in hops if g.edges[node, p]["tech"] == "nvlink")
                hops = nvlink or hops
            routes[node][dest] = hops
    return routes


def path(topo: Topology, routes: Routes, src: str, dst: str, choose=min) -> list[str]:
    """One path from src to dst following the routes (`choose` picks among ECMP hops)."""
    hops = [src]
    while hops[-1] != dst:
        nexts = routes[hops[-1]].get(dst)
        if not nexts or len(hops) > topo.graph.number_of_nodes():
            raise ValueError(f"no route from {src} to {dst}")
        hops.append(choose(nexts))
    return hops


def path_delay_ns(routes: Routes, link_ns, src: str, dst: str) -> tuple[float, float, float]:
    """(mean, min, max) one-way propagation delay from src to dst over the ECMP paths
    `routes` gives, `link_ns(a, b)` the delay of link a-b. The mean weighs each next hop
    equally at every node, as a uniform hash spreads flows."""
    memo: dict[str, tuple[float, float, float]] = {dst: (0.0, 0.0, 0.0)}

    def walk(node: str) -> tuple[float, float, float]:
        if node not in memo:
            hops = routes[node].get(dst)
            if not hops:
                raise ValueError(f"no route from {node} to {dst}")
            ways = [(link_ns(node, h) + m, link_ns(node, h) + lo, link_ns(node, h) + hi)
                    for h in hops for m, lo, hi in [walk(h)]]
            memo[node] = (sum(w[0] for w in ways) / len(ways), min(w[1] for w in ways),
                          max(w[2] for w in ways))
        return memo[node]

    return walk(src)


def path_bottleneck_mbps(routes: Routes, rate_mbps, src: str, dst: str) -> float:
    """The slowest link on the way from src to dst, `rate_mbps(a, b)` each link's rate;
    over ECMP paths the mean of their bottlenecks (each next hop weighed equally)."""
    memo: dict[str, float] = {}

    def walk(node: str) -> float:
        if node == dst:
            return float("inf")
        if node not in memo:
            hops = routes[node].get(dst)
            if not hops:
                raise ValueError(f"no route from {node} to {dst}")
            memo[node] = sum(min(rate_mbps(node, h), walk(h)) for h in hops) / len(hops)
        return memo[node]

    return walk(src)
