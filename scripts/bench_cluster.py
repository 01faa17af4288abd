#!/usr/bin/env python3
"""Benchmark: one fabric on two test servers against the same fabric on this machine.

Two "servers" on this machine that behave as machines do (tests/servers.py: each its own
network, mount, PID and UTS namespaces and sshd, reached only by ssh), so this measures
the wiring's cost, not capacity: both share this machine's cores.

1. Build: the same 66-node fabric (rail_optimized with 12 servers of 4 GPUs) built here
   (fabric.core) and spread over the two test servers (testbed.spread: placement, ssh,
   each server's part, VXLAN cut links), alternated --rounds times; wall seconds each.
       cluster_build_s_over_single = median spread build s / median local build s
2. Scale: rail128 (156 nodes, 2 x 64+) spread over the two, while the established ssh
   connections from the orchestrator are counted: one per server however many nodes
   (Mininet's cluster edition opened one per node and failed past ~10).
3. Ring: a 16-rank all-reduce (rail_optimized, 4 servers of 4 GPUs, rails order) at the
   rate this machine's calibration picks (`--rate auto`), on this machine and across the
   two test servers, alternated --rounds times, each with its fidelity verdict.
       cluster_allreduce_jct_over_ideal = median JCT / ideal of the spread runs
       (the ideal: 2(n-1)/n x size / link rate, nccl-tests' bus bandwidth)
   A figure counts where that run's verdict says the emulator kept up. The test servers
   share this machine's cores, so each runs half as many agent processes as one machine
   would (one per core in all).

Merges into results/bench.json with the machine's calibration.

    sudo .venv/bin/python scripts/bench_cluster.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric import netns  # noqa: E402
from fabric.core import Fabric  # noqa: E402
from testbed.benchmarks import machine_line, rate_auto, update_bench_json  # noqa: E402
from testbed.run import ensure_calibration  # noqa: E402
from testbed.spread import SpreadFabric  # noqa: E402
from tests.servers import servers_up  # noqa: E402
from topologies.files import resolve  # noqa: E402

LAB = "clbench"
BUILD_TOPO = ("rail_optimized", {"servers": 12})


def spread(servers, topo) -> SpreadFabric:
    return SpreadFabric(topo, servers.addresses, ssh_config=str(servers.ssh_config),
                        via_netns=servers.orch)


def build_round(servers, topo) -> tuple[float, float]:
    """(local build s, spread build s) of `topo`, each torn down after."""
    t0 = time.monotonic()
    with Fabric(topo, lab=LAB):
        local = time.monotonic() - t0
    fab = spread(servers, topo)
    fab.connect()
    try:
        t0 = time.monotonic()
        fab.start()
        far = time.monotonic() - t0
    finally:
        fab.stop()
        fab.close()
    return local, far


def ssh_connections(orch: str) -> int:
    """Established TCP connections to port 22 from the orchestrator's namespace."""
    with netns.entered(orch):
        out = subprocess.run(["ss", "-Htn", "state", "established", "( dport = :22 )"],
                             capture_output=True, text=True, timeout=10)
    return len(out.stdout.strip().splitlines())


def scale_round(servers) -> dict:
    topo = resolve("rail128")
    fab = spread(servers, topo)
    peak = [0]
    stop = threading.Event()

    def count() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], ssh_connections(servers.orch))

    watcher = threading.Thread(target=count, daemon=True)
    fab.connect()
    watcher.start()
    try:
        t0 = time.monotonic()
        fab.start()
        built = time.monotonic() - t0
        eps = topo.endpoints()
        # a sample of pairs across the cut: the first endpoint of each server to all
        firsts = {fab.server_of(e): e for e in reversed(eps)}
        got = [ok for a, b, ok in fab.ping_all(list(firsts.values()))]
    finally:
        stop.set()
        watcher.join(timeout=5)
        fab.stop()
        fab.close()
    return {"nodes": topo.graph.number_of_nodes(),
            "per_server": {s: len(fab.placement.nodes_on(s)) for s in fab.servers},
            "build_s": built, "ssh_connections_peak": peak[0],
            "pairs_ok": sum(got), "pairs": len(got)}


def ring_round(servers, spread_it: bool, out: Path) -> dict:
    from testbed.experiment import from_toml
    from testbed.run import run
    from testbed.run_spread import run_spread
    exp = from_toml(None, {"name": "ring16", "workload": "allreduce", "ranks": 16,
                           "ring_order": "rails", "iterations": 3, "rate": "auto",
                           "message_bytes": 1 << 20, "results_dir": str(out),
                           "topology": {"kind": "rail_optimized",
                                        "params": {"servers": 4}},
                           # the test servers share this machine's cores: one agent
                           # process each, as many in all as one machine runs (one a core)
                           **({"servers": servers.addresses,
                               "agent_processes": max(1, (os.cpu_count() or 2) // 2)}
                              if spread_it else {})})
    # a run reaches the servers as the command line does: ssh's config, and from where
    os.environ.update({"AFT_SSH_CONFIG": str(servers.ssh_config),
                       "AFT_SSH_NETNS": servers.orch})
    _, m = run_spread(exp) if spread_it else run(exp)
    return {"jct_over_ideal": m["jct_over_ideal"], "verdict": m["fidelity"]["verdict"],
            "reasons": m["fidelity"]["reasons"],
            "rate_mbps": m["link_mbps"], "exactly_once": m["flows"]["exactly_once"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternated repetitions")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.json"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print("bench_cluster: --rounds must be at least 1", file=sys.stderr)
        return 2
    ensure_calibration()   # cached per machine: the ring's --rate auto needs it
    print(f"# one fabric on two test servers vs this machine, x{args.rounds}; "
          f"{machine_line()}")
    topo = resolve(BUILD_TOPO[0], BUILD_TOPO[1])
    builds: dict[str, list[float]] = {"single": [], "spread": []}
    rings: dict[str, list[dict]] = {"single": [], "spread": []}
    with tempfile.TemporaryDirectory() as tmp, servers_up(LAB, 2, Path(tmp)) as servers:
        for r in range(args.rounds):
            local, far = build_round(servers, topo)
            builds["single"].append(local)
            builds["spread"].append(far)
            print(f"build {r + 1}/{args.rounds}: {topo.graph.number_of_nodes()} nodes, "
                  f"here {local:.1f} s, on 2 test servers {far:.1f} s", file=sys.stderr)
        scale = scale_round(servers)
        print(f"rail128 on 2 test servers: {scale['per_server']} nodes, built in "
              f"{scale['build_s']:.1f} s, {scale['ssh_connections_peak']} ssh connections "
              f"at most, {scale['pairs_ok']}/{scale['pairs']} pairs answer", file=sys.stderr)
        for r in range(args.rounds):
            for kind in ("single", "spread"):
                got = ring_round(servers, kind == "spread", Path(tmp) / "runs")
                rings[kind].append(got)
                print(f"ring {r + 1}/{args.rounds} {kind}: JCT/ideal "
                      f"{got['jct_over_ideal']:.3f} at {got['rate_mbps']:g} Mbit/s, "
                      f"{got['verdict']}" + "".join(f"; {r}" for r in got["reasons"]),
                      file=sys.stderr)
    med = {k: statistics.median(v) for k, v in builds.items()}
    ratio = med["spread"] / med["single"]
    print(f"\n| build of {topo.graph.number_of_nodes()} nodes | median s | min-max |\n"
          "|---|---|---|")
    for k, v in builds.items():
        print(f"| {k} | {med[k]:.2f} | {min(v):.2f}-{max(v):.2f} |")
    print(f"\ncluster_build_s_over_single = {ratio:.2f} (expected above 1: ssh, the code "
          "check, the placement, and VXLAN ports; both builds share this machine's cores)")
    print(f"rail128 (156 nodes) on 2 test servers: {scale['ssh_connections_peak']} ssh "
          f"connections at most during its build (expected: 2, one per server)")
    print("\n| ring of 16 | JCT / ideal (median, min-max) | rate Mbit/s | verdicts |\n"
          "|---|---|---|---|")
    jct = {}
    for k, v in rings.items():
        js = [x["jct_over_ideal"] for x in v]
        jct[k] = statistics.median(js)
        print(f"| {k} | {jct[k]:.3f} ({min(js):.3f}-{max(js):.3f}) | "
              f"{v[0]['rate_mbps']:g} | {', '.join(x['verdict'] for x in v)} |")
    faithful = [x for x in rings["spread"] if x["verdict"] == "faithful"]
    print(f"\nPhysics: a ring all-reduce takes 2(n-1)/n x size / link rate at best "
          f"(nccl-tests' bus bandwidth): JCT / ideal 1.0 is the wire's bound. Across the "
          f"two test servers the ring is {jct['spread'] / jct['single']:.2f}x its time on "
          f"one machine; {len(faithful)}/{len(rings['spread'])} spread runs faithful.")
    values = {"cluster_build_s_over_single": round(ratio, 3),
              "cluster_build_s_single": round(med["single"], 2),
              "cluster_build_s_spread": round(med["spread"], 2),
              "cluster_rail128_ssh_connections": scale["ssh_connections_peak"],
              "cluster_rail128_build_s": round(scale["build_s"], 2),
              "cluster_allreduce_jct_over_ideal": round(jct["spread"], 3),
              "cluster_allreduce_jct_over_ideal_min": round(min(
                  x["jct_over_ideal"] for x in rings["spread"]), 3),
              "cluster_allreduce_jct_over_ideal_max": round(max(
                  x["jct_over_ideal"] for x in rings["spread"]), 3),
              "cluster_allreduce_single_jct_over_ideal": round(jct["single"], 3),
              "cluster_allreduce_rate_mbps": rings["spread"][0]["rate_mbps"],
              "cluster_allreduce_verdicts": [x["verdict"] for x in rings["spread"]],
              **rate_auto("bench_cluster", [x["verdict"] for v in rings.values() for x in v])}
    update_bench_json(args.out, values)
    ok = scale["pairs_ok"] == scale["pairs"] and all(
        x["exactly_once"] for v in rings.values() for x in v)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
