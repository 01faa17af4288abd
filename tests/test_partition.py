"""Placing a fabric on several machines (topologies.partition, `testbed partition`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topologies import full_mesh, leaf_spine, rail_optimized
from topologies.files import resolve
from topologies.partition import check_servers, domains, partition
from topologies.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("topo", [rail_optimized(), resolve("rail128"),
                                  leaf_spine(leaves=4, spines=4, hosts_per_leaf=4)],
                         ids=["rail_optimized", "rail128", "leaf_spine"])
@pytest.mark.parametrize("k", [2, 3])
def test_every_node_placed_once_nvlink_domains_whole_and_the_cut_is_what_crosses(topo, k):
    servers = [f"m{i}" for i in range(k)]
    plan = partition(topo, servers)
    assert sorted(plan.placement) == sorted(topo.graph.nodes)
    assert set(plan.placement.values()) == set(servers)          # every server used
    for group in domains(topo):
        assert len({plan.placement[n] for n in group}) == 1, group
    crossing = {frozenset((a, b)) for a, b in topo.graph.edges
                if plan.placement[a] != plan.placement[b]}
    assert {frozenset((c.a, c.b)) for c in plan.cut} == crossing
    assert all(c.server_a != c.server_b for c in plan.cut)
    assert all(topo.graph.edges[a, b]["tech"] != "nvlink" for a, b in crossing)
    assert plan.cut_gbps() == pytest.approx(sum(c.rate_mbps for c in plan.cut) / 1000)
    total = sum(d["rate_mbps"] for _, _, d in topo.graph.edges(data=True))
    assert sum(plan.work_mbps.values()) == pytest.approx(2 * total)   # each link, both ends
    assert plan.imbalance() < 1.5


def test_a_symmetric_fabric_splits_evenly_on_two_machines():
    topo = leaf_spine(leaves=4, spines=4, hosts_per_leaf=4)
    plan = partition(topo, ["a", "b"])
    assert plan.imbalance() == pytest.approx(1.0)
    # the least cut of a 4x4 leaf-spine halves the leaves' uplinks: 2 leaves x 2 spines
    # on the far side each, both ways round
    assert len(plan.cut) == 8
    assert partition(topo, ["a", "b"]).placement == plan.placement    # deterministic


def test_one_server_holds_everything_and_too_many_are_refused():
    plan = partition(full_mesh(nodes=4), ["solo"])
    assert plan.cut == () and set(plan.placement.values()) == {"solo"}
    with pytest.raises(SpecError, match="5 servers for 4 indivisible parts"):
        partition(full_mesh(nodes=4), [f"m{i}" for i in range(5)])
    with pytest.raises(SpecError, match="servers: a server is listed twice"):
        check_servers(["a", "a"])
    with pytest.raises(SpecError, match="is not a host name"):
        check_servers(["a", "-oProxyCommand=x"])


def test_partition_cli_prints_the_plan_and_refuses_bad_input_in_one_line():
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "testbed", "partition", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    out = cli("rail_optimized", "--servers", "a,b")
    assert out.returncode == 0, out.stderr
    assert "on 2 servers" in out.stdout and "cut: 8 links over VXLAN" in out.stdout
    got = json.loads(cli("leaf_spine", "--servers", "a,b", "--format", "json").stdout)
    assert sorted(got["servers"]) == ["a", "b"] and got["imbalance"] == 1.0
    bad = cli("rail_optimized", "--servers", "a,,b")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--servers" in bad.stderr
