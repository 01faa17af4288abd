#!/usr/bin/env python3
"""Benchmark: build + teardown of the 128-GPU rail-optimized fabric vs plain Mininet.

Side by side in one run, on the same graph (topologies/rail128.toml):
  - ours:  testbed Fabric: namespaces, veth, addresses, HTB shaping, ECMP routes;
  - plain: Mininet with Linux bridges for the switches, default links, no routes or tc.
Teardown is timed until the kernel has finished freeing the namespaces (settle()), so
work the kernel does after the call returns is counted and does not slow the next build.
Each is built and torn down `--rounds` times, alternating; the medians are compared.
Writes/updates results/bench.json (flat name -> number) and prints a table.

The plain baseline makes links in the root namespace (its bridges and their ports,
named aftb<node>...): they are recorded before they exist and carry the testbed's mark
(fabric.state), and its shells carry the fabric marker, so `testbed clean` removes them
after a crash and leaves a user's look-alikes alone. SIGTERM tears down as Ctrl-C does.

    sudo .venv/bin/python scripts/bench_fabric.py [--rounds 3] [--topology rail128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from mininet import log as mnlog
from mininet.net import Mininet
from mininet.node import Host
from mininet.nodelib import LinuxBridge
from mininet.topo import Topo
from pyroute2 import IPRoute

from fabric import netns
from fabric.clean import destroy, leftovers, remove_root_links, root_links
from fabric.core import Fabric
from fabric.state import (
    MARKER_ENV,
    OWNER_ALIAS,
    all_records,
    forget_root_links,
    record_root_links,
)
from testbed.benchmarks import update_bench_json
from testbed.interrupts import stop_on_signals
from topologies import resolve
from topologies.spec import ENDPOINT_ROLES

ROOT = Path(__file__).resolve().parent.parent

LAB = "bench"  # our fabric's namespaces: aft-bench.<node>, beside anything deployed
BASELINE_LAB = "bench-baseline"          # the record of the baseline's root links
BASELINE_PREFIX = "aftb"                 # the baseline's node names: aftb<node>
BASELINE_MARKER = netns.name_of("baseline", LAB)   # in its shells' environment


class MarkedShell:
    """Mininet nodes whose shells (and what they start) carry the fabric marker."""

    def _popen(self, cmd, **params):
        params.setdefault("env", {**os.environ, MARKER_ENV: BASELINE_MARKER})
        return super()._popen(cmd, **params)


class BaselineHost(MarkedShell, Host):
    pass


class BaselineBridge(MarkedShell, LinuxBridge):
    pass


class GraphTopo(Topo):
    """The same graph as a plain Mininet topology (switch names carry the baseline prefix)."""

    def build(self, topo=None):
        name = {n: f"{BASELINE_PREFIX}{n}" for n in topo.graph.nodes}
        for node, data in topo.graph.nodes(data=True):
            if data["role"] in ENDPOINT_ROLES:
                self.addHost(name[node])
            else:
                self.addSwitch(name[node], stp=True)  # the graph has loops via spines
        for a, b in topo.graph.edges():
            self.addLink(name[a], name[b])

    def root_link_names(self) -> list[str]:
        """What Mininet will create in the root namespace: each switch's bridge and its
        ports (hosts live in their own namespaces)."""
        names = set(self.switches())
        for a, b in self.links():
            for node, port in zip((a, b), self.port(a, b), strict=True):
                if self.isSwitch(node):
                    names.add(f"{node}-eth{port}")
        return sorted(names)


def mark_root_links(names: list[str]) -> None:
    """The testbed's alias on each of `names` that exists in the root namespace."""
    with IPRoute() as ipr:
        for name in names:
            for index in ipr.link_lookup(ifname=name):
                ipr.link("set", index=index, ifalias=OWNER_ALIAS)


def start_plain(topo) -> tuple[Mininet, list[str]]:
    """The plain baseline, started; and the names of its root-namespace links."""
    mnlog.setLogLevel("error")
    graph_topo = GraphTopo(topo=topo)
    names = graph_topo.root_link_names()
    record_root_links(BASELINE_LAB, names)   # before they exist: a crash leaves a record
    net = Mininet(topo=graph_topo, host=BaselineHost, switch=BaselineBridge,
                  controller=None, ipBase="198.19.0.0/16", waitConnected=False)
    net.start()
    return net, names


def plain_mininet(topo) -> tuple[float, float]:
    t0 = time.monotonic()
    net, names = start_plain(topo)
    built = time.monotonic() - t0
    mark_root_links(names)                   # not timed: ours only, plain Mininet has none
    t0 = time.monotonic()
    net.stop()
    stopped = time.monotonic() - t0
    forget_root_links(BASELINE_LAB)
    return built, stopped + settle()


def ours(topo, seed: int) -> tuple[float, float]:
    t0 = time.monotonic()
    fabric = Fabric(topo, seed=seed, lab=LAB).start()
    built = time.monotonic() - t0
    t0 = time.monotonic()
    fabric.stop()
    stopped = time.monotonic() - t0
    return built, stopped + settle()


def settle(max_s: float = 60.0, fast_s: float = 0.002) -> float:
    """Wait until the kernel has finished freeing torn-down namespaces; return the wait.

    Namespace teardown goes on in the kernel after the last process leaves, under the
    rtnl lock. A link change in a scratch namespace (which takes that lock) answers
    fast again once it is done; five fast ones in a row count as settled. Both sides'
    teardown times include this.
    """
    name = netns.name_of("settle", LAB)
    t0 = time.monotonic()
    netns.create(name)
    try:
        with netns.entered(name):
            ipr = IPRoute()
        with ipr:
            lo = ipr.link_lookup(ifname="lo")[0]
            fast, mtu = 0, 65536
            while fast < 5 and time.monotonic() - t0 < max_s:
                mtu = 65535 if mtu == 65536 else 65536
                t = time.monotonic()
                ipr.link("set", index=lo, mtu=mtu)
                fast = fast + 1 if time.monotonic() - t < fast_s else 0
    finally:
        netns.remove(name)
    return time.monotonic() - t0



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="rail128", help="topology file or name")
    ap.add_argument("--rounds", type=int, default=3, help="build/teardown rounds of each")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    topo = resolve(args.topology)
    if leftovers(LAB) or root_links():
        print("leftovers of an earlier benchmark: run 'testbed clean' first", file=sys.stderr)
        return 2
    settle()
    rows = {"ours": [], "plain": []}
    leftover_counts = []
    try:
        for r in range(args.rounds):
            for kind in ("plain", "ours"):
                built, stopped = plain_mininet(topo) if kind == "plain" else ours(topo, r + 1)
                left = leftovers(LAB) + len(root_links())
                leftover_counts.append(left)
                rows[kind].append((built, stopped))
                print(f"round {r + 1}/{args.rounds} {kind:5s}: build {built:6.2f} s, "
                      f"teardown {stopped:5.2f} s, leftovers {left}", flush=True)
    finally:
        destroy(LAB)
        remove_root_links(all_records())
        forget_root_links(BASELINE_LAB)
    med = {k: (statistics.median(b for b, _ in v), statistics.median(s for _, s in v))
           for k, v in rows.items()}
    n_ep = len(topo.endpoints())
    results = {
        "fabric_build_vs_mininet": round(med["ours"][0] / med["plain"][0], 3),
        "fabric_build_plus_teardown_vs_mininet": round(sum(med["ours"]) / sum(med["plain"]), 3),
        "teardown_leftovers": max(leftover_counts),
    }
    print(f"\n# fabric build benchmark: {topo.name}, {n_ep} endpoints, "
          f"{topo.graph.number_of_nodes()} nodes, {topo.graph.number_of_edges()} links; "
          f"median of {args.rounds}")
    print(f"# {'':12s} {'build (s)':>10s} {'teardown (s)':>13s}")
    for k in ("plain", "ours"):
        print(f"  {k:12s} {med[k][0]:10.2f} {med[k][1]:13.2f}")
    for k, v in results.items():
        print(f"  {k:40s} {v}")
    update_bench_json(Path(args.out), results)
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    with stop_on_signals():   # SIGTERM: the finally above takes everything down
        sys.exit(main())
