"""One fabric spread over two machines (testbed.spread, testbed.remote, `testbed deploy
--servers`), on test servers that behave as machines do (tests/servers.py: each its own
network, mount, PID and UTS namespaces and sshd, reached only by ssh). This proves the
wiring, not capacity: both "servers" share this machine's two cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import netns
from testbed.spread import SpreadFabric
from topologies.files import resolve
from traffic.workloads import build_schedule

from .servers import servers_up

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.root


@pytest.fixture
def servers(tmp_path, host_untouched):
    before = netns.named()
    with servers_up("spr", 2, tmp_path) as got:
        yield got
    assert netns.named() == before      # the servers' fabrics never showed up here


def spread(servers, topo: str) -> SpreadFabric:
    return SpreadFabric(resolve(topo), servers.addresses, ssh_config=str(servers.ssh_config),
                        via_netns=servers.orch)


def cli(servers, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "AFT_SSH_CONFIG": str(servers.ssh_config),
           "AFT_SSH_NETNS": servers.orch}
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def netns_on(servers, i: int) -> list[str]:
    ssh = servers.ssh(i)
    try:
        return [line.split()[0] for line in ssh.run("ip netns list").stdout.splitlines()]
    finally:
        ssh.close()


def recv_flows(results: dict) -> list[dict]:
    return [f for r in results.values() for f in r["flows"] if f["role"] == "recv"]


def test_a_rail_optimized_fabric_split_over_two_servers_carries_a_ring_exactly_once(servers):
    fab = spread(servers, "rail_optimized")
    a, b = servers.addresses
    with fab:
        # each server holds its part, NVLink domains whole, and nothing else
        assert sorted(netns_on(servers, 0)) == sorted(f"aft-{n}" for n in fab.placement.nodes_on(a))
        assert sorted(netns_on(servers, 1)) == sorted(f"aft-{n}" for n in fab.placement.nodes_on(b))
        for server in (0, 1):
            domains = {n[:2] for n in fab.placement.nodes_on(servers.addresses[server])
                       if n.startswith("s")}
            other = fab.placement.nodes_on(servers.addresses[1 - server])
            assert not any(n[:2] in domains for n in other if n.startswith("s"))
        assert len(fab.placement.cut) == 8
        pairs = fab.ping_all()
        assert len(pairs) == 16 * 15 and all(ok for _, _, ok in pairs), \
            [p for p in pairs if not p[2]][:5]
        before = fab.counters()
        ranks = ["s0g0", "s1g0", "s2g0", "s3g0"]        # two on each server
        assert {fab.server_of(r) for r in ranks} == {a, b}
        size = 256 * 1024
        results = fab.run_agents(build_schedule("allreduce", ranks, size), iterations=2)
        after = fab.counters()
    assert all(r["ok"] for r in results.values()), {n: r.get("error") for n, r in results.items()}
    flows = recv_flows(results)
    assert len(flows) == 2 * 2 * (len(ranks) - 1) * len(ranks)  # 2 iterations of 2(n-1) steps
    assert all(f["exactly_once"] for f in flows)
    assert sum(f["bytes_delivered"] for f in flows) == sum(f["size_bytes"] for f in flows)
    # the ring crossed the cut: VXLAN ports on both servers carried its packets
    crossed = 0
    for x, y, _ in fab.cut_links():
        for node, peer in ((x, y), (y, x)):
            port = fab.plan.port(node, peer).ifname
            crossed += after[node][port]["tx_packets"] - before[node][port]["tx_packets"]
    assert crossed >= 2 * len(ranks) * size // 4096 // 2
    assert {r["server"] for r in results.values()} == {a, b}


def test_ecmp_spreads_over_the_links_the_cut_crosses(servers):
    fab = spread(servers, "leaf_spine")
    a, b = servers.addresses
    with fab:
        src = next(n for n in fab.topo.endpoints() if fab.server_of(n) == a)
        dst = next(n for n in fab.topo.endpoints() if fab.server_of(n) == b)
        leaf = next(iter(fab.topo.graph.adj[src]))
        uplinks = [p.ifname for p in fab.plan.ports[leaf]
                   if fab.topo.role(p.peer) == "spine"]
        crossing = {fab.plan.port(leaf, p.peer).ifname for p in fab.plan.ports[leaf]
                    if frozenset((leaf, p.peer)) in {frozenset(c[:2]) for c in fab.cut_links()}}
        assert len(uplinks) == 2 and len(crossing) == 1   # one uplink local, one cut
        before = fab.counters()
        results = fab.run_agents(build_schedule("p2p", [src, dst], 1 << 20, pairs=[(src, dst)]),
                                 transport="uet", entropy="spray")
        after = fab.counters()
    assert all(r["ok"] for r in results.values())
    assert all(f["exactly_once"] for f in recv_flows(results))

    def tx(node: str, ifname: str) -> int:
        return after[node][ifname]["tx_packets"] - before[node][ifname]["tx_packets"]

    sent = {u: tx(leaf, u) for u in uplinks}
    total = sum(sent.values())
    assert total >= 256, sent
    # the leaf's kernel hashes each packet's UDP port over both spines: the VXLAN uplink
    # and the local one each carry a fair share (binomial: under 20 % is ~1e-20 here)
    assert all(v >= 0.2 * total for v in sent.values()), sent
    # and the packets cross the cut over both of its links: leaf to the far spine, or
    # the near spine to the far leaf
    over = {(x, y): tx(x, fab.plan.port(x, y).ifname) + tx(y, fab.plan.port(y, x).ifname)
            for x, y, _ in fab.cut_links()}
    assert len(over) == 2 and all(v >= 0.2 * total for v in over.values()), over


def test_clean_on_one_server_leaves_the_other_and_this_machine_untouched(servers):
    out = cli(servers, "deploy", "leaf_spine", "--servers", ",".join(servers.addresses),
              "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reachability: 12/12 endpoint pairs answer" in out.stdout
    assert "cut: 2 links over VXLAN" in out.stdout
    try:
        assert len(netns_on(servers, 0)) == 4 and len(netns_on(servers, 1)) == 4
        # a second deploy is refused before it builds, and takes nothing down
        again = cli(servers, "deploy", "leaf_spine", "--servers",
                    ",".join(servers.addresses))
        assert again.returncode == 2 and "a fabric is deployed there already" in again.stderr
        assert len(netns_on(servers, 0)) == 4 and len(netns_on(servers, 1)) == 4
        gone = cli(servers, "clean", "--servers", servers.addresses[0])
        assert gone.returncode == 0, gone.stderr
        assert re.search(rf"{re.escape(servers.addresses[0])}: removed 4 namespaces",
                         gone.stdout), gone.stdout
        assert netns_on(servers, 0) == [] and len(netns_on(servers, 1)) == 4
    finally:
        done = cli(servers, "destroy", "--servers", ",".join(servers.addresses))
    assert done.returncode == 0, done.stderr
    assert netns_on(servers, 1) == []


def test_a_server_that_cannot_be_used_is_one_line_and_exit_2_before_anything(servers):
    # no testbed where the servers are told to look
    env_dir = {"AFT_REMOTE_DIR": "/nonexistent/testbed"}
    os.environ.update(env_dir)
    try:
        out = cli(servers, "deploy", "leaf_spine", "--servers", ",".join(servers.addresses))
    finally:
        del os.environ["AFT_REMOTE_DIR"]
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "no testbed at /nonexistent/testbed on srv" in out.stderr
    # a server whose sshd is down
    servers.stop(1)
    out = cli(servers, "deploy", "leaf_spine", "--servers", ",".join(servers.addresses))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert re.match(rf"testbed deploy: server {re.escape(servers.addresses[1])}: ssh: ",
                    out.stderr), out.stderr
    assert netns_on(servers, 0) == []                       # nothing was built


def test_a_run_over_two_servers_gathers_one_results_folder(servers, tmp_path):
    exp = tmp_path / "ring.toml"
    exp.write_text('[experiment]\nname = "ring"\nworkload = "allreduce"\n'
                   'topology = "leaf_spine"\nmessage_bytes = 131072\niterations = 2\n'
                   f'results_dir = "{tmp_path / "results"}"\n'
                   f'[cluster]\nservers = {json.dumps(servers.addresses)}\n')
    out = cli(servers, "run", str(exp))
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    (folder,) = (tmp_path / "results").iterdir()
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    assert metrics["flows"]["bytes_delivered"] == metrics["flows"]["bytes_expected"] > 0
    assert metrics["links"]["drops"] == 0
    spread_info = json.loads((folder / "servers.json").read_text())
    assert sorted(spread_info["run"]) == sorted(servers.addresses)
    for s, r in spread_info["run"].items():
        # both "servers" share this machine's clock: the measured offset is within
        # its uncertainty (half the shortest round trip over ssh) of zero
        assert abs(r["clock"]["offset_ns"]) <= r["clock"]["uncertainty_ns"] + 50_000, r
        assert r["fidelity"]["verdict"] in ("faithful", "degraded", "unfaithful")
        assert len(spread_info["nodes"][s]) == 4
    assert metrics["fidelity"]["verdict"] == max(
        (r["fidelity"]["verdict"] for r in spread_info["run"].values()),
        key=["faithful", "degraded", "unfaithful"].index)
    assert len(spread_info["cut"]) == 2
    summary = (folder / "summary.md").read_text()
    assert "## Servers" in summary and "exactly once: yes" in summary
    assert "[cluster]" in (folder / "config.toml").read_text()
    # every port of both servers' nodes was sampled, on one time axis
    header, *rows = (folder / "links.csv").read_text().splitlines()
    assert {r.split(",")[1] for r in rows} == set(resolve("leaf_spine").graph.nodes)


def tshark_rows(pcap: Path) -> list[list[str]]:
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "frame.time_relative",
                          "-e", "eth.src", "-e", "ip.dsfield.dscp", "-e", "frame.len",
                          "-e", "macc.cbfc.enbv", "-e", "macc.cbfc.pause_time.c3"],
                         capture_output=True, text=True, timeout=120, check=True)
    return [line.split("\t") for line in out.stdout.splitlines()]


def test_a_pfc_pause_crosses_a_vxlan_link_and_stops_its_sender(servers, tmp_path):
    from fabric.addressing import plan
    from topologies.partition import partition
    topo = resolve("leaf_spine")
    cut = partition(topo, servers.addresses).cut
    addresses = plan(topo)
    ports = [addresses.port(n, p) for c in cut for n, p in ((c.a, c.b), (c.b, c.a))]
    out = cli(servers, "run", "--topology", "leaf_spine", "--workload", "incast", "--pfc",
              "on", "--message-bytes", "1048576", "--iterations", "2", "--results-dir",
              str(tmp_path / "results"), "--servers", ",".join(servers.addresses),
              "--pcap", *[p.ifname for p in ports])
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    (folder,) = (tmp_path / "results").iterdir()
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["ok"] and metrics["flows"]["exactly_once"]
    rows = {p.ifname: tshark_rows(folder / "pcaps" / f"{p.ifname}.pcap") for p in ports}
    crossed = 0
    for c in cut:
        for node, peer in ((c.a, c.b), (c.b, c.a)):
            here, there = addresses.port(node, peer), addresses.port(peer, node)
            frames = {side: [r for r in rows[side.ifname] if r[1] == here.mac and r[4]]
                      for side in (here, there)}
            # every pause frame `node` sent arrives at `peer`, decoded as PFC of priority 3
            assert len(frames[here]) == len(frames[there]), (node, peer)
            assert all(r[4] == "0x0008" for r in frames[there])
            crossed += len(frames[there])
            # while a pause holds (from its XOFF to its XON, past 1 ms for the hold to
            # land), the paused side sends next to nothing of the lossless class
            windows, start = [], None
            for r in frames[there]:
                t, quanta = float(r[0]), int(r[5])
                if quanta and start is None:
                    start = t
                elif not quanta and start is not None:
                    windows.append((start + 0.001, t))
                    start = None
            held_s = sum(max(0.0, b - a) for a, b in windows)
            sent = sum(int(r[3]) for r in rows[there.ifname]
                       if r[1] == there.mac and r[2] == "26"
                       and any(a <= float(r[0]) <= b for a, b in windows))
            if held_s > 0.01:
                assert sent * 8 / held_s < 0.1 * 100e6, (node, peer, sent, held_s)
    assert crossed > 0, "no pause crossed a VXLAN link"
    # the far servers' receivers counted what crossed, as XOFF and XON pairs
    received = metrics["pfc"]["from_other_servers"]
    assert received["frames_received"] == crossed
    assert received["xoff_frames"] == received["xon_frames"] > 0
    # each server graded its own lossless class, from its own controller's report
    assert all("lossless" in r["fidelity"]["grades"] for r in metrics["servers"].values())
